// Stands in for the site's worker (bench-load-parallel.mjs): loads every file of the manifest, in this thread
// (startLoad, its cache writes held until the "sessions" are made, as site.js does) or through the loader's worker
// (startLoadInWorker), and as each file is ready spends `busy` ms of synchronous work on it, as making its
// onnxruntime-web session would. Posts the times from the load's start (ms). mode 'base': startLoad of another
// checkout's runtime, served at /base-runtime/.

const hex = (buf) => Array.from(new Uint8Array(buf), (b) => b.toString(16).padStart(2, '0')).join('');

self.onmessage = async ({ data: { mode, busy, cache, check } }) => {
  try {
    /** @type {typeof import('../../webbuild/template/runtime/loader.js')} */
    const loader = await import(mode === 'base' ? '/base-runtime/loader.js' : '/runtime/loader.js');
    const m = await loader.loadManifest('/');
    const names = Object.keys(m.files);
    const t0 = performance.now();
    const start = mode === 'worker' ? loader.startLoadInWorker : loader.startLoad;
    if (!start) throw new Error(`the runtime of mode ${mode} has no such loader`);
    const warnings = [];
    const load = start(m, names, { deferCache: true, onWarning: (w) => warnings.push([w.code, w.shard]), ...(!cache && { cache: null }) });
    load.done.catch(() => {});
    const busyMs = [];
    for (const name of names) {
      await load.ready(name);
      const t = performance.now();
      while (performance.now() - t < busy); // a session being made: this thread does nothing else meanwhile
      busyMs.push(Math.round(performance.now() - t));
    }
    await (load.verified ?? load.done); // main's loader: done
    const ready = performance.now() - t0;
    load.flushCache?.(); // the loader of main has no such thing: its writes were made as the shards verified
    const files = await load.done;
    const done = performance.now() - t0;
    let filesOk;
    if (check) {
      filesOk = true;
      for (const [name, bytes] of files) filesOk &&= hex(await crypto.subtle.digest('SHA-256', bytes)) === m.files[name].sha256;
    }
    const cacheKeys = cache ? (await (await caches.open(`webbuild-${m.model_id}`)).keys()).length : 0;
    self.postMessage({ mode, ready_ms: Math.round(ready), done_ms: Math.round(done), busy_ms: busyMs, stats: load.stats,
      bytes: [...files.values()].reduce((n, f) => n + f.length, 0), filesOk, cacheKeys, warnings });
  } catch (e) {
    self.postMessage({ error: `${e.name}: ${e.message}` });
  }
};
