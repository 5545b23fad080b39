// The delta graph's runs (webbuild/forms/lora_delta.py): at a switch the page makes the adapted step form's
// merged updates (layout kind `delta`: down @ up in 4-bit blocks) on the GPU, one run per layer, reading the adapted
// graph's down and ups (already on the GPU) and writing into the step's input buffers (onnxruntime-web's
// pre-allocated GPU outputs: no copy, no read-back). Each record's `delta` names its run, the graph's names of its
// sources (`from`) and of itself (`to`).

/** @typedef {import('webbuild-types').OrtTensor} OrtTensor */
/** @typedef {import('./lora-encode.js').LoraLayout} LoraLayout */
/** @typedef {{inputs: Record<string, OrtTensor>, outputs: Record<string, OrtTensor>}} DeltaRun */

// The delta graph's feeds and outputs of each run: `feeds` the adapted graph's tensors by adapter tensor, `step` the
// step form's by input name (those made so far).
/**
 * @param {LoraLayout} layout
 * @param {Record<string, OrtTensor>} feeds
 * @param {Record<string, OrtTensor>} step
 * @returns {DeltaRun[]}
 */
export function deltaRuns(layout, feeds, step) {
  /** @type {Map<number, DeltaRun>} */
  const runs = new Map();
  for (const [name, r] of Object.entries(layout)) {
    if (!r.delta || !(name in step)) continue;
    const run = runs.get(r.delta.run) ?? { inputs: {}, outputs: {} };
    runs.set(r.delta.run, run);
    r.delta.from.forEach((n, i) => {
      const tensor = feeds[r.from[i]];
      if (!tensor) throw new Error(`the delta graph's ${n}: no ${r.from[i]} among the adapter's inputs; rebuild the site`);
      run.inputs[n] = tensor;
    });
    run.outputs[r.delta.to] = step[name];
  }
  return [...runs.values()];
}

// Each run of the delta graph `session` (in turn: they share its buffers), its names checked against the graph's.
/**
 * @param {import('webbuild-types').OrtSession} session
 * @param {DeltaRun[]} runs
 */
export async function runDeltas(session, runs) {
  for (const { inputs, outputs } of runs) {
    const missing = [...session.inputNames.filter((n) => !(n in inputs)), ...session.outputNames.filter((n) => !(n in outputs))];
    if (missing.length) throw new Error(`the delta graph's ${missing.join(', ')}: not in the manifest's lora_layout; rebuild the site`);
    await session.run(inputs, outputs);
  }
}
