// int8.html's module worker: the synthetic plan's uint8 weights by int8Weights here and by int8WeightsInWorkers,
// rounds alternating; whether the bytes are the same, how many workers ran, each run's ms.
import { int8Weights, int8WeightsInWorkers } from '/runtime/int8.js';
import { synthetic } from './int8-synthetic.js';

self.onmessage = async ({ data: q }) => {
  try {
    const shapes = (q.shapes ?? '1024x3072').split(',').map((s) => s.split('x').map(Number));
    const { plan, source } = synthetic(shapes);
    const workers = Number(q.workers ?? navigator.hardwareConcurrency), runs = [];
    let same = true, used = 0;
    for (let round = 0; round < Number(q.rounds ?? 1); round++) {
      let t0 = performance.now();
      const here = int8Weights(plan, source);
      runs.push({ form: 'here', round, ms: Math.round(performance.now() - t0) });
      t0 = performance.now();
      const shared = await int8WeightsInWorkers(plan, source, workers);
      runs.push({ form: `${shared.workers} workers`, round, ms: Math.round(performance.now() - t0) });
      used = shared.workers;
      same &&= here.length === shared.bytes.length && here.every((b, i) => b === shared.bytes[i]);
    }
    self.postMessage({ same, workers: used, bytes: plan.bytes, cores: navigator.hardwareConcurrency, runs });
  } catch (e) {
    self.postMessage({ error: String(e) });
  }
};
