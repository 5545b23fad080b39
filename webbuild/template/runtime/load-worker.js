// The loader's own thread (loader.js startLoadInWorker starts it): startLoad on the manifest and files it is sent,
// each file's buffer posted as soon as its shards are verified (transferred: the one copy moves, nothing is
// copied), with the progress, the warnings and what the load took; the cache writes are made here too (held until
// 'flush' where the load defers them: they take copies then, loader.js MAX_HELD_BYTES). The last message ('done' or
// 'error') comes once they are made.

import { emptyStats, openModelCache, startLoad } from './loader.js';

const ctl = new AbortController();
/** @type {import('./loader.js').Load | null} */
let load = null;
let flushed = false; // 'flush' came (perhaps before the load began)
const flush = () => { flushed = true; load?.flushCache(); };
/** @param {unknown} msg @param {Transferable[]} [transfer] */
const post = (msg, transfer = []) => self.postMessage(msg, { transfer });

self.onmessage = ({ data }) => {
  if (data.type === 'abort') ctl.abort(new DOMException('the load was aborted', 'AbortError'));
  else if (data.type === 'flush') flush();
  else if (data.type === 'start') run(data);
};
post({ type: 'up' });

/**
 * @param {{manifest: import('./loader.js').LoadedManifest, names: string[], cache: string | null,
 *   options: import('./loader.js').LoadOptions}} msg cache: the model id whose Cache API store to use, null: none
 */
async function run({ manifest, names, cache, options }) {
  const workerT0 = performance.timeOrigin + performance.now();
  const stats = () => ({ workerT0, ...(load?.stats ?? emptyStats()) });
  try {
    const opts = {
      ...options, signal: ctl.signal, handOff: true,
      onProgress: (/** @type {import('./loader.js').Progress} */ progress) => post({ type: 'progress', progress }),
      onWarning: (/** @type {import('./loader.js').LoadWarning} */ warning) => post({ type: 'warning', warning }),
    };
    const store = cache === null ? null : await openModelCache(cache, opts);
    load = startLoad(manifest, names, { ...opts, cache: store });
    const l = load;
    if (flushed) l.flushCache();
    const sent = names.map((name) => l.ready(name).then((bytes) => post({ type: 'file', name, bytes, stats: stats() }, [bytes.buffer])));
    const allSent = Promise.all(sent);
    allSent.catch(() => {}); // a file that failed fails verified too
    await l.verified;
    await allSent;
    post({ type: 'verified', stats: stats() });
    await l.done;
    post({ type: 'done', stats: stats() });
  } catch (e) {
    await load?.done.catch(() => {}); // the writes of the shards verified so far are made first (resume)
    const { name, message, code, shard, status, retryable, retryAfter } = e ?? {};
    post({ type: 'error', error: { name, message: message ?? String(e), code, shard, status, retryable, retryAfter }, stats: stats() });
  }
}
