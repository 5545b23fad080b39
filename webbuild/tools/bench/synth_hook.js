// Appended to the site's worker.js in a bench-only copy of the site (webbuild/tools/bench/instrument.py
// instrumented_worker(), behind counters.mjs's source): module scope, so it sees the worker's `site`.
// Not part of any shipped site. Driven through Playwright's Worker.evaluate by
// webbuild/tools/bench/page_bench.py (`webbuild bench --runtime browser`) and rounds.py (`webbuild bench --rounds`).

// bench.mjs's synthetic decode in the site's own worker: n greedy steps past any end token after two
// seconds of silence (the 41-token prompt the peers get). steps: the gaps between the per-token callbacks (decode step times, ms); counts:
// the WebGPU calls made during it (counters.mjs totals, kernels included).
self.__wbSynth = async (n) => {
  if (!site) throw new Error('the model is not loaded yet');
  const { recogniser, runtime } = site;
  const stamps = [];
  const c0 = self.__gpuCounters.snapshot();
  const r = await recogniser.transcribe(new Float32Array(2 * runtime.sample_rate), {
    maxNewTokens: n + 1, forceSteps: true, onToken: () => stamps.push(performance.now()),
  });
  const c1 = self.__gpuCounters.snapshot();
  const counts = gpuCountsDelta(c0, c1);
  const t = r.timings;
  return { steps: stamps.slice(1).map((s, i) => s - stamps[i]), stamps, ids: r.tokens, tokens: r.tokens.length, counts,
    prompt_tokens: t.prompt_tokens, prefill_ms: t.prefill_ms, ttft_ms: t.ttft_ms };
};

// The short and the long decode of gpuCountedDecodes (counters.mjs), exactly as bench.mjs runs them under
// Node: the long one's result, and counters_per_token (null on the wasm EP or below 2 tokens).
self.__wbCountedSynth = (nLong) => gpuCountedDecodes(self.__wbSynth, nLong, site?.ep === 'webgpu', self);

// onnxruntime-web's wasm memory now (worker.js imports runtime/heap.js first): the peak, as it only grows; null on
// a site built before runtime/heap.js (an older build in an A/B), whose worker has no wasmHeapBytes
self.__wbHeap = () => (typeof wasmHeapBytes === 'function' ? wasmHeapBytes() : null);

// Where a decode token's time goes in this browser (timing.mjs, as bench.mjs's timing_per_token under Node):
// an n-step decode with the WebGPU calls timed, then a GPU-timed one. The timing wrap is on only here.
self.__wbTimedSynth = async (n) => {
  const t = self.__gpuTiming;
  const rec = site?.recogniser;
  if (!t || !rec) throw new Error('no timing harness or no model');
  if (site.ep !== 'webgpu') return null;
  // the decoder's runs, or the captured decode's steps (one read-back each): each object once, the adapted
  // sessions' too (a switched adapter gives the recogniser other ones)
  t.watched ??= new WeakSet();
  for (const [obj, kind] of [[rec.decoder, undefined], [rec.steps, 'issue']]) {
    if (obj && !t.watched.has(obj)) {
      t.watchRun(obj, kind);
      t.watched.add(obj);
    }
  }
  t.on = true;
  try {
    t.runs.length = 0;
    return await gpuTimingPerToken(self.__wbSynth, await self.__wbSynth(n), self);
  } finally {
    t.on = false;
  }
};

// One transcription of a clip (webbuild/tools/bench/first_use.py): its 16 kHz PCM as base64 float32 bytes, one
// chunk through the site's recogniser as a clip of that length reaches it. The compute pipelines it made
// (counters.mjs `created`), told apart into the encoder's (made before the encoder's run ended) and the
// decoder's, with the transcript's timings.
self.__wbFirstUse = async (b64, maxNewTokens) => {
  if (!site) throw new Error('the model is not loaded yet');
  const bytes = Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
  const pcm = new Float32Array(bytes.buffer);
  const created = self.__gpuCounters?.created ?? [];
  const from = created.length;
  const t0 = performance.now();
  const r = await site.recogniser.transcribe(pcm, { maxNewTokens: maxNewTokens ?? site.runtime.max_new_tokens });
  const made = created.slice(from);
  const encoderEnd = t0 + r.timings.encoder_ms;
  return {
    text: r.text, tokens: r.tokens.length, timings: r.timings,
    encoder_pipelines: made.filter((p) => p.at <= encoderEnd).map((p) => p.name),
    decoder_pipelines: made.filter((p) => p.at > encoderEnd).map((p) => p.name),
  };
};

// The captured decode's steps one by one (`webbuild bench --rounds --step-trace`): for each step the time its
// issue() began (t0), its session.run and read-back copy were submitted (t1) and its token came back (t2), with
// `inFlight` steps queued ahead of the token being read and, with yieldEach, a macrotask after each issue (a page
// hands its WebGPU commands to the GPU process when its task ends). Where a captured step waits: in the run, or
// for the read-back.
self.__wbStepTrace = async (n, { inFlight = 0, yieldEach = false } = {}) => {
  const steps = site?.recogniser?.steps;
  if (!steps) throw new Error('the site decodes no captured steps (decode form: ' + site?.recogniser?.decodeMode + ')');
  /** @type {{t0: number, t1: number, t2: number | null}[]} */
  const trace = [];
  const { inFlight: before } = steps;
  const issue = steps.issue;
  if (inFlight) steps.inFlight = inFlight;
  steps.issue = async function (total) {
    const t0 = performance.now();
    const r = await issue.call(this, total);
    const row = { t0, t1: performance.now(), t2: null };
    trace.push(row);
    r.pick.then(() => { row.t2 = performance.now(); });
    if (yieldEach) await new Promise((resolve) => setTimeout(resolve, 0));
    return r;
  };
  try {
    const out = await self.__wbSynth(n);
    return { trace, steps: out.steps, in_flight: steps.inFlight, yield_each: yieldEach };
  } finally {
    steps.issue = issue;
    steps.inFlight = before;
  }
};

// The captured step's replay alone, n times back to back (`webbuild bench --rounds --step-trace`), in three forms:
// 'runs' (session.run after session.run, one wait for the GPU at the end), 'map' (each run followed by the
// read-back's copy and a mapAsync nobody waits for until the end, as issue() does) and 'done' (each run waited
// for with onSubmittedWorkDone). Per step: the wall time over n, and each form's first and last run returns.
// Tells a slow replay from a slow read-back. The tokens are not used: the static buffers hold the last decode's.
self.__wbReplayBurst = async (n, form) => {
  const steps = site?.recogniser?.steps;
  if (!steps?.recorded) throw new Error('no recorded captured step (run a captured decode first)');
  const { device, session, feeds, fetches } = steps;
  const staging = form === 'map'
    ? Array.from({ length: n }, () => device.createBuffer({ size: 16, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST }))
    : [];
  const maps = [];
  const runs = [];
  await device.queue.onSubmittedWorkDone();
  const t0 = performance.now();
  for (let i = 0; i < n; i++) {
    await session.run(feeds, fetches);
    runs.push(performance.now() - t0);
    if (form === 'map') {
      const enc = device.createCommandEncoder();
      enc.copyBufferToBuffer(steps.ids.gpuBuffer, 0, staging[i], 0, 4);
      device.queue.submit([enc.finish()]);
      maps.push(staging[i].mapAsync(GPUMapMode.READ).then(() => performance.now() - t0));
    } else if (form === 'done') {
      await device.queue.onSubmittedWorkDone();
    }
  }
  const issued = performance.now() - t0;
  const mapped = await Promise.all(maps);
  await device.queue.onSubmittedWorkDone();
  const wall = performance.now() - t0;
  for (const b of staging) b.destroy();
  return { form, n, per_step_ms: wall / n, issued_ms: issued, wall_ms: wall, runs, mapped };
};
