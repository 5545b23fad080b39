// onnxruntime-web's start, run while the encoder's files still download. Its first session pays for the start
// (instantiating its wasm, initialising its runtime and the WebGPU device's context: about a second on a 2-core
// box and on the H100 machine's host, whatever the graph), so a session of one Identity node made as soon as the
// wasm binary is verified takes that second off the encoder's session, which waits for its files anyway.

// ModelProto (IR 8, opset 17): graph "start", y = Identity(x), x and y float[1]
// (tests/test_ort_start.py parses it with onnx)
export const START_MODEL = new Uint8Array([8, 8, 18, 0, 58, 59, 10, 16, 10, 1, 120, 18, 1, 121, 34, 8, 73, 100, 101, 110,
  116, 105, 116, 121, 18, 5, 115, 116, 97, 114, 116, 90, 15, 10, 1, 120, 18, 10, 10, 8, 8, 1, 18, 4, 10, 2, 8, 1, 98,
  15, 10, 1, 121, 18, 10, 10, 8, 8, 1, 18, 4, 10, 2, 8, 1, 66, 4, 10, 0, 16, 17]);

/**
 * Starts onnxruntime-web on `provider` (the sessions' own execution provider, so that the device's context is made
 * with their options) by making and releasing START_MODEL's session. Never rejects: a start that fails leaves the
 * model's first session to fail with its own error (and the page to fall back).
 * @param {import('webbuild-types').Ort} ort
 * @param {import('./asr.js').Provider} provider
 * @returns {Promise<{start: number, end: number, error: string | null}>} performance.now() stamps
 */
export async function startOrt(ort, provider) {
  const start = performance.now();
  try {
    const session = await ort.InferenceSession.create(START_MODEL, { graphOptimizationLevel: 'all', logSeverityLevel: 3,
      executionProviders: [provider] });
    await session.release();
    return { start, end: performance.now(), error: null };
  } catch (e) {
    return { start, end: performance.now(), error: String(/** @type {Error} */ (e)?.message ?? e) };
  }
}
