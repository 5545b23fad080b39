// webbuild model loader: fetches the content-hashed shards named by manifest.json (format v1),
// verifies each one's sha256, caches verified shards, and reassembles logical files.
// Plain ES module (its one import, within.js, is a bounded wait): runs in a page, a worker, and Node >= 20.
//
//   const manifest = await loadManifest('./model/');
//   const files = await loadFiles(manifest, manifest.variants.fp16.files, {onProgress});
//   // files: Map<logical name, Uint8Array>, e.g. ORT externalData or env.wasm.wasmBinary
//   const load = startLoad(manifest, names, opts); await load.ready('encoder.fp32.onnx'); ... await load.done;
//   // each file as soon as its own shards are verified, while the others still download
//   const load = startLoadInWorker(manifest, names, opts);   // the same, on a thread of its own (load-worker.js)
//
// A shard is hashed (WebCrypto sha256) as soon as its bytes are in, while its lane fetches the next shard:
// hashing overlaps the downloads instead of following each one.
// Memory: each requested file is allocated once at its final size and shards are streamed
// straight into it; the only other buffers are per in-flight shard (<= concurrency x shard size).
// Resume: every shard is cached once it is verified (its write queued, one at a time, off the path that hands
// files out), so a re-run after a failure or an abort fetches only what is missing. Docs: docs/packaging.md.

import { within } from './within.js';

export const MANIFEST_FORMAT = 'webbuild-manifest';
export const MANIFEST_FORMAT_VERSION = 1;
const CACHE_PREFIX = 'webbuild-';
// handOff with deferCache: the most bytes of shard copies held for the cache writes before they go anyway
export const MAX_HELD_BYTES = 512 * 2 ** 20;

/** @typedef {import('webbuild-types').Manifest & {url?: string}} LoadedManifest  url: set by loadManifest */
/** @typedef {import('webbuild-types').Manifest['shards'][number]} Shard */
/** @typedef {{phase: 'download' | 'verify', loaded: number, total: number, file: string, shard: string}} Progress */
/**
 * @typedef {{code: string, message: string, shard?: string, attempt?: number, retries?: number, delayMs?: number}} LoadWarning
 *   attempt, retries, delayMs: a retry's (code 'retry')
 */
/**
 * Where verified shards are kept, keyed by absolute shard URL (the Cache API, or a MemoryStore).
 * @typedef {{
 *   match(key: string): Promise<Response | undefined>,
 *   put(key: string, response: Response): Promise<void>,
 *   delete(key: string): Promise<boolean>,
 *   keys(): Promise<string[]>,
 *   modelId?: string,
 *   stalled?: boolean,
 * }} Store  modelId: set on the Cache API's store of that model (openCacheStore), which the loader worker opens too;
 *   stalled: set once it stopped answering (later loads of the page go on without it)
 */
/**
 * @typedef {object} LoadOptions
 * @property {number} [concurrency] shards in flight
 * @property {number} [retries]
 * @property {number} [retryDelayMs]
 * @property {number} [maxRetryDelayMs]
 * @property {(p: Progress) => void} [onProgress]
 * @property {(w: LoadWarning) => void} [onWarning]
 * @property {AbortSignal} [signal]
 * @property {number} [cacheTimeoutMs] how long the cache may take to open or to answer a read before the load goes on
 *   without it (a browser's storage that never answers must not hold up the download)
 * @property {Store | null | false} [cache] null or false: no cache; unset: the Cache API where there is one
 * @property {boolean} [deferCache] hold the cache writes until load.flushCache() (or a failure)
 * @property {boolean} [handOff] the files leave this thread once ready (load-worker.js transfers them): each
 *   cache write takes a copy of its shard when it verifies; the writes held by deferCache go once their copies
 *   pass maxHeldBytes
 * @property {number} [maxHeldBytes] handOff with deferCache: the most bytes of copies held (MAX_HELD_BYTES)
 */
/** @typedef {Required<Omit<LoadOptions, 'cache' | 'deferCache' | 'handOff' | 'maxHeldBytes'>>} Options  LoadOptions with the defaults filled in */
/** @typedef {{dest: Uint8Array<ArrayBuffer>, at: number, offset: number, length: number}} Target  a part: shard bytes [offset, offset+length) go to dest[at] */
/** @typedef {{shard: Shard, url: string, targets: Target[], file: string, files: string[]}} Job  files: every file it holds parts of */
/**
 * A load under way (startLoad): the files' buffers (complete once ready(name) or verified resolves); verified: every
 * shard checked; done: that and every cache write made (what loadFiles returns); flushCache(): lets the writes held
 * by deferCache go; release(name): the file is no longer needed (a session holds what it took): it leaves `files`,
 * and its memory is freed now where this thread holds the only copy (the loader's worker sent it; in this thread a
 * held cache write may still read it, so the collector frees it later); what the load took (filled as it goes;
 * final once verified resolves).
 * @typedef {{files: Map<string, Uint8Array<ArrayBuffer>>, ready: (name: string) => Promise<Uint8Array<ArrayBuffer>>,
 *   verified: Promise<Map<string, Uint8Array<ArrayBuffer>>>, done: Promise<Map<string, Uint8Array<ArrayBuffer>>>,
 *   flushCache: () => void, release: (name: string) => void, stats: LoadStats}} Load
 */
/**
 * @typedef {object} LoadStats  ms
 * @property {number} download_ms from the start to the last shard's last byte (from the network or the cache)
 * @property {number} hash_ms time in sha256 digests, summed over shards (it overlaps the downloads)
 * @property {number} verified_ms from the start to every shard verified
 * @property {number} cache_ms from the start to the last shard read from the cache (0: none was there)
 * @property {number} cache_bytes bytes of the shards read from the cache
 * @property {number} network_bytes bytes of the shards downloaded
 * @property {boolean} kept every shard downloaded is in the cache (false without a cache, or once a write failed);
 *   final once `done` resolves
 */
/**
 * @typedef {object} LoadState
 * @property {Store | null} store
 * @property {Options} o
 * @property {LoadedManifest} manifest
 * @property {number} total bytes of all shards to load
 * @property {Map<string, number>} received shard path -> bytes received so far
 * @property {number} verified bytes verified
 * @property {boolean} [cacheOff] set once a put failed or the cache stopped answering: the cache is not used further
 * @property {(job: Job, buf: Uint8Array<ArrayBuffer>) => void} cacheLater queues a verified shard's cache write
 * @property {LoadStats} stats
 * @property {number} t0 performance.now() at the start
 */

export class LoadError extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, shard?: string, status?: number, cause?: unknown}} [details]
   */
  constructor(message, { code, shard, status, cause } = {}) {
    super(message, { cause });
    this.name = 'LoadError';
    this.code = code; // 'http' | 'network' | 'corrupt' | 'manifest' | 'unknown-file' | 'memory'
    this.shard = shard;
    this.status = status;
    this.retryable = false; // worth another try (a server error, a network failure)
    this.retryAfter = 0; // ms the server asked to wait (Retry-After), 0 if it did not
  }
}

// ---------------------------------------------------------------- manifest

/**
 * @param {string | URL} baseUrl the model folder, or manifest.json's own URL
 * @param {LoadOptions} [opts]
 * @returns {Promise<LoadedManifest>}
 */
export async function loadManifest(baseUrl, opts = {}) {
  const url = manifestUrl(baseUrl);
  const o = options(opts);
  // 'no-cache' revalidates: the manifest is the one file whose name does not change per build.
  const res = await fetchRetrying(url, { cache: 'no-cache' }, o, 'manifest.json');
  let m;
  try {
    m = await res.json();
  } catch (e) {
    throw new LoadError(`${url}: manifest is not valid JSON`, { code: 'manifest', cause: e });
  }
  if (m?.format !== MANIFEST_FORMAT || m.format_version !== MANIFEST_FORMAT_VERSION) {
    throw new LoadError(`${url}: not a ${MANIFEST_FORMAT} v${MANIFEST_FORMAT_VERSION} manifest ` +
      `(format=${m?.format}, format_version=${m?.format_version}); rebuild the site or update the loader`,
      { code: 'manifest' });
  }
  m.url = url; // shard paths resolve against it
  return m;
}

/** @param {string | URL} baseUrl */
function manifestUrl(baseUrl) {
  const base = new URL(baseUrl, globalThis.location?.href);
  if (base.pathname.endsWith('.json')) return base.href;
  if (!base.pathname.endsWith('/')) base.pathname += '/';
  return new URL('manifest.json', base).href;
}

// ---------------------------------------------------------------- public loading API

/**
 * @param {LoadedManifest} manifest
 * @param {string} variant
 * @param {LoadOptions} [opts]
 */
export async function loadVariant(manifest, variant, opts) {
  const v = manifest.variants?.[variant];
  if (!v) throw new LoadError(`unknown variant ${variant}; the build has ${Object.keys(manifest.variants ?? {}).join(', ')}`, { code: 'unknown-file' });
  return loadFiles(manifest, v.files, opts);
}

/**
 * @param {LoadedManifest} manifest
 * @param {Iterable<string>} names logical file names
 * @param {LoadOptions} [opts]
 * @returns {Promise<Map<string, Uint8Array<ArrayBuffer>>>} logical name -> its bytes
 */
export async function loadFiles(manifest, names, opts = {}) {
  return startLoad(manifest, names, opts).done;
}

// loadFiles, with each file's bytes as soon as its shards are verified (ready), so that a session can be made
// from one file while the others download; verified settles after every shard, done after their cache writes too;
// both reject on the first failure (ready of a file not complete by then rejects with it), done only once the
// shards verified before it are written (resume relies on them).
/**
 * @param {LoadedManifest} manifest
 * @param {Iterable<string>} names logical file names
 * @param {LoadOptions} [opts]
 * @returns {Load}
 */
export function startLoad(manifest, names, opts = {}) {
  const o = options(opts);
  const { outputs, jobs } = plan(manifest, names);
  /** @type {LoadStats} */
  const stats = emptyStats();
  const waits = new Map([...outputs.keys()].map((n) => [n, deferred()]));
  const left = new Map([...outputs.keys()].map((n) => [n, jobs.filter((j) => j.files.includes(n)).length]));
  const verified = /** @type {Deferred<Map<string, Uint8Array<ArrayBuffer>>>} */ (deferred());
  let handingOut = false; // files are handed out (ready) once the cache has been read: see below
  // Cache writes: one at a time in the order the shards verify (deferCache: from flushCache() on); no file waits for
  // them. handOff: a write takes its copy now (Response() copies), as the file may be transferred away.
  /** @type {() => void} */
  let flushCache = () => {};
  /** @type {Promise<unknown>} */
  let writes = opts.deferCache ? new Promise((resolve) => { flushCache = () => resolve(undefined); }) : Promise.resolve();
  let held = 0; // bytes of the copies handOff's writes hold
  /** @param {string} name */
  const handOut = (name) => waits.get(name)?.resolve(/** @type {Uint8Array<ArrayBuffer>} */ (outputs.get(name)));
  /** @param {Job} job */
  const shardDone = (job) => {
    for (const name of job.files) {
      const n = /** @type {number} */ (left.get(name)) - 1;
      left.set(name, n);
      if (!n && handingOut) handOut(name);
    }
  };
  const done = (async () => {
    if (o.signal.aborted) throw o.signal.reason;
    const keys = new Set(manifest.shards.map((s) => shardUrl(manifest, s.path)));
    const opened = await resolveStore(opts.cache, manifest.model_id, o);
    const store = opened && await pruneStale(opened, keys, o) ? opened : null;
    /** @type {LoadState} */
    const state = {
      store, o, manifest, stats, t0: performance.now(),
      total: jobs.reduce((n, j) => n + j.shard.size, 0),
      received: new Map(), // shard path -> bytes received so far (download progress)
      verified: 0,
      cacheLater: (job, buf) => {
        if (!store || state.cacheOff) return;
        const body = opts.handOff ? cacheEntry(buf) : buf;
        writes = writes.then(() => cachePut(job, body, state));
        if (opts.handOff && (held += buf.length) > (opts.maxHeldBytes ?? MAX_HELD_BYTES)) flushCache();
      },
    };
    // An internal controller so that one failed shard stops the others promptly.
    const ctl = new AbortController();
    const stop = () => ctl.abort(o.signal.reason);
    o.signal.addEventListener('abort', stop, { once: true });
    /** @type {Promise<void>[]} */
    const tails = []; // each shard's hashing and caching, which its lane does not wait for
    const hashing = new Set(); // the tails not settled: at most `concurrency` (each digest holds a copy of its shard)
    /**
     * Loads `list` from `from`; returns the jobs the cache did not hold.
     * @param {Job[]} list
     * @param {'cache' | 'network'} from
     */
    const loadAll = async (list, from) => {
      /** @type {Job[]} */
      const missed = [];
      await runPool(list, o.concurrency, async (job) => {
        const loaded = await loadShard(job, state, ctl.signal, from);
        if (!loaded) return void missed.push(job);
        const t = loaded.tail.then(() => shardDone(job), (e) => { ctl.abort(e); throw e; });
        const settled = t.finally(() => hashing.delete(settled)).catch(() => {});
        hashing.add(settled);
        tails.push(t);
        while (hashing.size > o.concurrency) await Promise.race(hashing);
      }, ctl);
      await Promise.all(tails);
      return missed;
    };
    try {
      // Every cached shard is read before any file is handed out: in Chrome, Cache API reads stalled for good
      // while a session was being made from a file (a second visit that never loaded); network reads do not.
      const rest = store ? await loadAll(jobs, 'cache') : jobs;
      handingOut = true;
      for (const [name, n] of left) if (!n) handOut(name); // empty files too
      await loadAll(rest, 'network');
    } catch (e) {
      await Promise.allSettled(tails); // nothing writes to the outputs after this settles
      verified.reject(e);
      flushCache(); // the shards verified so far are written all the same: a re-run resumes from them
      await writes;
      throw e;
    } finally {
      o.signal.removeEventListener('abort', stop);
    }
    stats.verified_ms = performance.now() - state.t0;
    verified.resolve(outputs);
    await writes;
    stats.kept = Boolean(store) && !state.cacheOff;
    return outputs;
  })();
  done.catch((e) => { verified.reject(e); for (const w of waits.values()) w.reject(e); });
  return {
    files: outputs, stats, done, verified: verified.promise, flushCache: () => flushCache(),
    release: (name) => { outputs.delete(name); waits.delete(name); },
    ready: (name) => waits.get(name)?.promise ?? Promise.reject(new LoadError(`${name}: not a file of this load`, { code: 'unknown-file' })),
  };
}

// how long the loader's worker may take to start before the load runs in this thread instead
const WORKER_START_MS = 15000;

// startLoad on a thread of its own: a module worker (load-worker.js) fetches, checks and caches the shards and
// transfers each file's buffer here as soon as it is ready, so that what this thread does meanwhile (making
// sessions: synchronous wasm work) does not hold up the download. The same Load, with each file's buffer once
// it arrived in `files`. In this thread where there is no Worker (Node), where the cache is a store of this
// thread's own (a MemoryStore), or where the worker does not start.
/**
 * @param {LoadedManifest} manifest
 * @param {Iterable<string>} names logical file names
 * @param {LoadOptions} [opts]
 * @returns {Load}
 */
export function startLoadInWorker(manifest, names, opts = {}) {
  const { cache } = opts;
  const here = () => startLoad(manifest, names, opts);
  if (typeof Worker !== 'function' || !(cache === undefined || cache === null || cache === false || cache.modelId)) return here();
  const o = options(opts);
  const list = [...new Set(names)];
  /** @type {Map<string, Uint8Array<ArrayBuffer>>} */
  const files = new Map();
  const waits = new Map(list.map((n) => [n, deferred()]));
  const verified = /** @type {Deferred<Map<string, Uint8Array<ArrayBuffer>>>} */ (deferred());
  const done = /** @type {Deferred<Map<string, Uint8Array<ArrayBuffer>>>} */ (deferred());
  const stats = emptyStats();
  /** @type {Load} */
  const load = {
    files, stats, verified: verified.promise, done: done.promise,
    flushCache: () => { if (up) worker?.postMessage({ type: 'flush' }); else flushed = true; },
    // the worker transferred each file here: this thread's copy is the only one
    release: (name) => { detachBuffer(files.get(name)); files.delete(name); waits.delete(name); },
    ready: (name) => waits.get(name)?.promise ?? Promise.reject(new LoadError(`${name}: not a file of this load`, { code: 'unknown-file' })),
  };
  const t0 = performance.timeOrigin + performance.now();
  /** @param {Load} inner a load in this thread, instead: its results become this one's */
  const adopt = (inner) => {
    load.flushCache = inner.flushCache;
    load.release = (name) => { files.delete(name); waits.delete(name); inner.release(name); };
    if (flushed) inner.flushCache();
    for (const [name, w] of waits) inner.ready(name).then((b) => { files.set(name, b); w.resolve(b); }, w.reject);
    inner.verified.then(verified.resolve, verified.reject);
    inner.done.then(done.resolve, done.reject);
    inner.verified.finally(() => Object.assign(stats, inner.stats)).catch(() => {});
    inner.done.finally(() => Object.assign(stats, inner.stats)).catch(() => {}); // kept: final then
  };
  /** @param {unknown} e */
  const fail = (e) => { verified.reject(e); done.reject(e); for (const w of waits.values()) w.reject(e); };
  /** @type {Worker | undefined} */
  let worker;
  let up = false;
  try {
    worker = new Worker(new URL('./load-worker.js', import.meta.url), { type: 'module' });
  } catch { // e.g. a policy that forbids workers
    return here();
  }
  let flushed = false;
  // a worker that neither starts nor fails (a browser that never runs its module) is given up: the load goes on here
  const startTimer = setTimeout(() => { if (!up) { worker?.terminate(); adopt(here()); } }, WORKER_START_MS);
  worker.onerror = (ev) => { // before 'up': the module did not load; later: a crash
    ev.preventDefault?.();
    worker.terminate();
    clearTimeout(startTimer);
    if (!up) adopt(here());
    else fail(new LoadError(`the loader's worker failed (${ev.message})`, { code: 'network' }));
  };
  /** @param {LoadStats & {workerT0: number}} s times from the worker's start */
  const took = ({ workerT0, ...s }) => {
    const late = workerT0 - t0; // the worker's start-up, counted as part of the load
    Object.assign(stats, s, { download_ms: s.download_ms + late, verified_ms: s.verified_ms && s.verified_ms + late,
      cache_ms: s.cache_ms && s.cache_ms + late });
  };
  worker.onmessage = ({ data }) => {
    if (data.type === 'up') {
      clearTimeout(startTimer);
      up = true;
      worker.postMessage({ type: 'start', manifest, names: list,
        cache: cache ? (cache.stalled ? null : cache.modelId) : cache === undefined ? manifest.model_id : null,
        options: { concurrency: o.concurrency, retries: o.retries, retryDelayMs: o.retryDelayMs, maxRetryDelayMs: o.maxRetryDelayMs,
          cacheTimeoutMs: o.cacheTimeoutMs, maxHeldBytes: opts.maxHeldBytes,
          deferCache: Boolean(opts.deferCache) && !flushed } });
    } else if (data.type === 'progress') o.onProgress(data.progress);
    else if (data.type === 'warning') o.onWarning(data.warning);
    else if (data.type === 'file') {
      took(data.stats);
      files.set(data.name, data.bytes);
      waits.get(data.name)?.resolve(data.bytes);
    } else if (data.type === 'verified') {
      took(data.stats);
      verified.resolve(files);
    } else if (data.type === 'done' || data.type === 'error') { // the last message: the cache writes are made
      took(data.stats);
      worker.terminate();
      o.signal.removeEventListener('abort', abort);
      if (data.type === 'done') done.resolve(files);
      else fail(o.signal.aborted ? o.signal.reason : Object.assign(new LoadError(data.error.message, data.error), data.error));
    }
  };
  const abort = () => { fail(o.signal.reason); worker.postMessage({ type: 'abort' }); };
  if (o.signal.aborted) abort();
  else o.signal.addEventListener('abort', abort, { once: true });
  return load;
}

// Frees a buffer's memory now rather than at the collector's next full run (which may come after the tab's peak):
// ArrayBuffer.prototype.transfer(0) detaches it, and every view of it then reads as empty (where there is no
// transfer(), as in Node 20, a structured clone's transfer detaches it and the collector frees the memory, which
// no forgotten view then holds). Only a view of a whole buffer: a part of a larger one leaves it alone.
/** @param {Uint8Array | undefined} bytes */
export function detachBuffer(bytes) {
  const buf = /** @type {ArrayBuffer & {transfer?: (n: number) => ArrayBuffer}} */ (bytes?.buffer);
  if (!bytes || !(buf instanceof ArrayBuffer) || bytes.byteOffset !== 0 || bytes.byteLength !== buf.byteLength) return;
  if (buf.transfer) buf.transfer(0);
  else structuredClone(buf, { transfer: [buf] });
}

/** @returns {LoadStats} */
export function emptyStats() {
  return { download_ms: 0, hash_ms: 0, verified_ms: 0, cache_ms: 0, cache_bytes: 0, network_bytes: 0, kept: false };
}

/**
 * @template T
 * @typedef {{promise: Promise<T>, resolve: (v: T) => void, reject: (e: unknown) => void}} Deferred
 */

/**
 * A promise with its resolve and reject; its rejection is handled (a file nobody waits for fails quietly).
 * @template T
 */
function deferred() {
  /** @type {(v: T) => void} */
  let resolve = () => {};
  /** @type {(e: unknown) => void} */
  let reject = () => {};
  const promise = /** @type {Promise<T>} */ (new Promise((res, rej) => { resolve = res; reject = rej; }));
  promise.catch(() => {});
  return { promise, resolve, reject };
}

// Deletes every cached shard of this model id (all versions). Returns true if a cache existed.
/**
 * @param {string} modelId
 * @param {{cacheStorage?: CacheStorage}} [opts]
 */
export async function clearCache(modelId, { cacheStorage = globalThis.caches } = {}) {
  if (!cacheStorage) return false;
  return cacheStorage.delete(CACHE_PREFIX + modelId);
}

// ---------------------------------------------------------------- stores

// Cache API store (page or worker). Keys are absolute shard URLs, which carry the content hash.
/**
 * @param {string} modelId
 * @returns {Promise<Store>}
 */
export async function openCacheStore(modelId, cacheStorage = globalThis.caches) {
  const cache = await cacheStorage.open(CACHE_PREFIX + modelId);
  return {
    modelId,
    match: (key) => cache.match(key),
    put: (key, response) => cache.put(key, response),
    delete: (key) => cache.delete(key),
    keys: async () => (await cache.keys()).map((r) => r.url),
  };
}

// In-memory store with the same interface: for Node, tests, or as a per-process cache.
/** @implements {Store} */
export class MemoryStore {
  constructor() { /** @type {Map<string, Uint8Array>} */ this.entries = new Map(); }
  /** @param {string} key */
  async match(key) { const b = this.entries.get(key); return b ? new Response(b) : undefined; }
  /** @param {string} key @param {Response} response */
  async put(key, response) { this.entries.set(key, new Uint8Array(await response.arrayBuffer())); }
  /** @param {string} key */
  async delete(key) { return this.entries.delete(key); }
  async keys() { return [...this.entries.keys()]; }
}

// LoadOptions.cacheTimeoutMs's default
const CACHE_TIMEOUT_MS = 15000;

// The store loadFiles opens for `modelId` when opts.cache is unset (the Cache API, or null where there
// is none). Opened once and passed as `cache` to several loadFiles calls, it warns once.
/**
 * @param {string} modelId
 * @param {LoadOptions} [opts]
 */
export async function openModelCache(modelId, opts = {}) {
  return resolveStore(opts.cache, modelId, options(opts));
}

/**
 * @param {Store | null | false | undefined} cache
 * @param {string} modelId
 * @param {Options} o
 * @returns {Promise<Store | null>}
 */
async function resolveStore(cache, modelId, o) {
  if (cache === null || cache === false) return null;
  if (cache) return cache.stalled ? null : cache; // a store that stopped answering is not asked again
  if (!globalThis.caches) return null; // Node, or an insecure (http://non-localhost) page
  try {
    // bounded: a browser whose storage never answers must not hold up the download (it goes on uncached)
    return await within(openCacheStore(modelId), o.cacheTimeoutMs, "the browser's storage");
  } catch (e) { // e.g. private browsing modes that refuse storage
    o.onWarning({ code: 'cache-unavailable', message: `model cache unavailable (${e.message}); the model will be downloaded on every visit` });
    return null;
  }
}

// Stale-cache handling: entries of other builds of this model are dropped, so storage does not
// grow per deploy. Shards unchanged between builds keep their key (same hash) and stay cached. Bounded like every
// other cache call: false where the storage stopped answering (the load then goes on without the cache, as where it
// could not be opened).
/**
 * @param {Store} store
 * @param {Set<string>} keep shard URLs of this build
 * @param {Options} o
 * @returns {Promise<boolean>} whether the store answered
 */
async function pruneStale(store, keep, o) {
  try {
    const keys = await within(store.keys(), o.cacheTimeoutMs, "the browser's cache");
    for (const key of keys) if (!keep.has(key)) await within(store.delete(key), o.cacheTimeoutMs, "the browser's cache");
  } catch (e) {
    if (/** @type {Error} */ (e).name === 'TimeoutError') {
      store.stalled = true;
      warnStalled(e, o);
      return false;
    }
    o.onWarning({ code: 'cache-error', message: `could not prune old cached shards: ${/** @type {Error} */ (e).message}` });
  }
  return true;
}

// The one warning of a cache that stopped answering (within's TimeoutError): the load goes on from the network.
/** @param {unknown} e @param {Options} o */
function warnStalled(e, o) {
  o.onWarning({ code: 'cache-unavailable', message: `${/** @type {Error} */ (e).message}; the model is downloaded instead` });
}

// ---------------------------------------------------------------- planning

/**
 * @param {LoadedManifest} manifest
 * @param {Iterable<string>} requested
 */
function plan(manifest, requested) {
  const names = [...new Set(requested)];
  const unknown = names.filter((n) => !Object.hasOwn(manifest.files, n));
  if (unknown.length) throw new LoadError(`manifest has no file(s) ${unknown.join(', ')}`, { code: 'unknown-file' });
  const shards = new Map(manifest.shards.map((s) => [s.path, s]));
  /** @type {Map<string, Uint8Array<ArrayBuffer>>} */
  const outputs = new Map();
  /** @type {Map<string, Job>} */
  const jobs = new Map(); // shard path -> {shard, url, targets}
  for (const name of names) {
    const f = manifest.files[name];
    const dest = allocate(name, f.size); // the one allocation per file
    outputs.set(name, dest);
    let at = 0;
    for (const p of f.parts) {
      const shard = shards.get(p.shard);
      if (!shard || p.offset + p.length > shard.size) throw new LoadError(`${name}: bad part ${p.shard} in manifest`, { code: 'manifest' });
      if (!jobs.has(p.shard)) jobs.set(p.shard, { shard, url: shardUrl(manifest, p.shard), targets: [], file: name, files: [] });
      const job = /** @type {Job} */ (jobs.get(p.shard));
      job.targets.push({ dest, at, offset: p.offset, length: p.length });
      if (!job.files.includes(name)) job.files.push(name);
      at += p.length;
    }
  }
  return { outputs, jobs: [...jobs.values()] };
}

/**
 * @param {string} name
 * @param {number} size
 */
function allocate(name, size) {
  try {
    return new Uint8Array(size);
  } catch (e) { // RangeError: Chrome holds no single buffer of 2 GiB or more, and tabs have limits
    throw new LoadError(`${name}: cannot allocate ${(size / 2 ** 20).toFixed(0)} MiB in this browser tab ` +
      `(${e.message}); a model file must stay under 2 GiB and fit in the tab's memory`, { code: 'memory', cause: e });
  }
}

/**
 * @param {LoadedManifest} manifest
 * @param {string} path
 */
function shardUrl(manifest, path) {
  return new URL(path, manifest.url ?? globalThis.location?.href).href;
}

// ---------------------------------------------------------------- one shard

// Fetches one shard from the cache (null where it holds no good copy) or the network; resolves once its bytes
// are in, with `tail`: its check (sha256; a mismatch is fetched once more), caching and copy-out, which the caller
// awaits apart.
/**
 * @param {Job} job
 * @param {LoadState} state
 * @param {AbortSignal} signal
 * @param {'cache' | 'network'} from
 * @returns {Promise<{tail: Promise<void>} | null>}
 */
async function loadShard(job, state, signal, from) {
  const { shard } = job;
  // Stream straight into the output when one part is the whole shard (always, for webbuild's
  // own packer); otherwise into a scratch buffer that is copied out after verification.
  const primary = job.targets.find((t) => t.offset === 0 && t.length === shard.size);
  const buf = primary ? primary.dest.subarray(primary.at, primary.at + shard.size) : new Uint8Array(shard.size);
  const cached = from === 'cache';
  if (cached && !await fromCache(job, buf, /** @type {LoadState & {store: Store}} */ (state), signal)) return null;
  const whole = cached || await download(job, buf, state, signal, 'default');
  const stats = state.stats;
  stats.download_ms = performance.now() - state.t0;
  if (cached) stats.cache_ms = stats.download_ms;
  stats[cached ? 'cache_bytes' : 'network_bytes'] += shard.size;
  const tail = (async () => {
    if (!cached) await checked(job, buf, whole, state, signal);
    state.verified += shard.size;
    state.o.onProgress({ phase: 'verify', loaded: state.verified, total: state.total, file: job.file, shard: shard.path });
    if (!cached) state.cacheLater(job, buf); // queued right away: this is what resume relies on
    for (const t of job.targets) if (t !== primary) t.dest.set(buf.subarray(t.offset, t.offset + t.length), t.at);
  })();
  tail.catch(() => {}); // the caller handles it; not an unhandled rejection meanwhile
  return { tail };
}

// True when the store held this shard and it verified.
/**
 * @param {Job} job
 * @param {Uint8Array<ArrayBuffer>} buf
 * @param {LoadState & {store: Store}} state
 * @param {AbortSignal} signal
 */
async function fromCache(job, buf, state, signal) {
  if (state.cacheOff) return false;
  let res;
  try {
    res = await within(state.store.match(job.url), state.o.cacheTimeoutMs, "the browser's cache");
  } catch (e) {
    if (/** @type {Error} */ (e).name === 'TimeoutError' && !state.cacheOff) {
      state.cacheOff = true; // a storage that stalls once is not asked again: every shard comes from the network
      warnStalled(e, state.o);
    }
    return false;
  }
  if (!res) return false;
  try {
    if (await readBody(res, buf, 0, (n) => progress(state, job, n), signal) === buf.length &&
        await verify(buf, job.shard.sha256, state)) return true;
  } catch (e) {
    if (signal.aborted) throw e;
  }
  // A broken cache entry is not fatal: drop it and go to the network.
  state.o.onWarning({ code: 'cache-corrupt', shard: job.shard.path, message: `cached ${job.shard.path} failed verification; downloading it again` });
  await state.store.delete(job.url).catch(() => {});
  return false;
}

// Checks a downloaded shard (whole: its body was no longer than the manifest says); a mismatch is
// re-downloaded once, then it is an error.
/**
 * @param {Job} job
 * @param {Uint8Array<ArrayBuffer>} buf
 * @param {boolean} whole
 * @param {LoadState} state
 * @param {AbortSignal} signal
 */
async function checked(job, buf, whole, state, signal) {
  const { shard } = job;
  if (whole && await verify(buf, shard.sha256, state)) return;
  state.o.onWarning({ code: 'corrupt', shard: shard.path, message: `${shard.path} failed sha256 verification; downloading it again` });
  // The re-download bypasses the HTTP cache, which may hold the bad copy.
  if (await download(job, buf, state, signal, 'reload') && await verify(buf, shard.sha256, state)) return;
  throw new LoadError(`${shard.path}: sha256 mismatch after re-download; the file on the server is corrupt or was replaced (expected ${shard.sha256})`, { code: 'corrupt', shard: shard.path });
}

// Downloads one shard into buf with retries; false if the body is longer than the manifest says.
// A retry after a partial body asks for the rest with a Range request when the server allows
// it, so a dropped connection does not cost the bytes already received.
/**
 * @param {Job} job
 * @param {Uint8Array} buf
 * @param {LoadState} state
 * @param {AbortSignal} signal
 * @param {RequestCache} cacheMode
 */
async function download(job, buf, state, signal, cacheMode) {
  let have = 0;
  progress(state, job, 0);
  for (let attempt = 0; ; attempt++) {
    try {
      /** @type {Record<string, string>} */
      const headers = have ? { Range: `bytes=${have}-` } : {};
      const res = await fetchOnce(job.url, { cache: have ? 'no-store' : cacheMode, headers, signal }, job.shard.path);
      if (have && !resumes(res, have)) have = 0; // server ignored the range: start over
      have = await readBody(res, buf, have, (n) => { have = n; progress(state, job, n); }, signal);
      if (have > buf.length) return false;
      if (have < buf.length) throw transient(`${job.shard.path}: body ended at ${have} of ${buf.length} bytes`);
      return true;
    } catch (e) {
      await backoffOrThrow(e, attempt, state.o, signal, job.shard.path);
    }
  }
}

/**
 * @param {Response} res
 * @param {number} have
 */
function resumes(res, have) {
  return res.status === 206 && /^bytes (\d+)-/.exec(res.headers.get('content-range') ?? '')?.[1] === String(have);
}

/** @param {Uint8Array<ArrayBuffer>} buf a shard's bytes; Response() copies them, so buf may be reused */
function cacheEntry(buf) {
  return new Response(buf, { headers: { 'content-type': 'application/octet-stream' } });
}

/**
 * @param {Job} job
 * @param {Uint8Array<ArrayBuffer> | Response} body the shard's bytes, or cacheEntry() of them
 * @param {LoadState} state
 */
async function cachePut(job, body, state) {
  if (!state.store || state.cacheOff) return;
  try {
    // the key carries the content hash
    await state.store.put(job.url, body instanceof Response ? body : cacheEntry(body));
  } catch (e) {
    state.cacheOff = true; // keep loading: the model still works, it is just not kept
    const quota = e?.name === 'QuotaExceededError' || e?.code === 22;
    const mib = (state.manifest.total_bytes / 2 ** 20).toFixed(0);
    state.o.onWarning(quota
      ? { code: 'quota', message: `This browser's storage for the site is full: the model (${mib} MiB) loads, but it could not be ` +
        "kept for the next visit, which downloads it again. Free space in the browser's site settings to keep it." }
      : { code: 'cache-error', shard: job.shard.path, message: `could not cache ${job.shard.path} (${e?.message}); continuing without the cache` });
  }
}

// ---------------------------------------------------------------- streaming + verification

// Copies a response body into buf from `start`; onBytes(bytes in buf so far). Returns the byte
// count, or buf.length + 1 as soon as the body turns out longer than buf (it is then corrupt).
/**
 * @param {Response} res
 * @param {Uint8Array} buf
 * @param {number} start
 * @param {(n: number) => void} onBytes
 * @param {AbortSignal} signal
 * @returns {Promise<number>}
 */
async function readBody(res, buf, start, onBytes, signal) {
  let n = start;
  /** @param {Uint8Array} chunk */
  const put = (chunk) => {
    if (n + chunk.length > buf.length) return false;
    buf.set(chunk, n);
    n += chunk.length;
    onBytes(n);
    return true;
  };
  if (!res.body?.getReader) return put(new Uint8Array(await res.arrayBuffer())) ? n : buf.length + 1;
  const byob = byobReader(res.body);
  // either reader, read below with a view only when it is the BYOB one
  const reader = /** @type {{read(view?: Uint8Array<ArrayBuffer>): Promise<ReadableStreamReadResult<Uint8Array<ArrayBuffer>>>, cancel(): Promise<void>}} */ (
    byob ?? res.body.getReader());
  /** @type {ArrayBuffer | null} */
  let scratch = byob && (scratchPool.pop() ?? new ArrayBuffer(SCRATCH_BYTES));
  try {
    for (;;) {
      if (signal.aborted) throw signal.reason;
      const { done, value } = await (byob ? reader.read(new Uint8Array(/** @type {ArrayBuffer} */ (scratch)))
 : reader.read());
      if (byob && value) scratch = value.buffer; // the read transferred it; this is ours again
      if (done) return n;
      if (!put(value)) return buf.length + 1;
    }
  } finally {
    if (scratch?.byteLength) scratchPool.push(scratch); // a failed read leaves it detached (0 bytes)
    reader.cancel().catch(() => {}); // frees the connection on early exit
  }
}

// Why BYOB: a default reader hands out a fresh buffer per network chunk; on a 700 MB model that
// garbage outgrows the collector and the tab peaks far above one copy of the model. BYOB reads
// land in a few reused scratch buffers instead.
const SCRATCH_BYTES = 1 << 20;
/** @type {ArrayBuffer[]} */
const scratchPool = [];

/** @param {ReadableStream<Uint8Array>} body */
function byobReader(body) {
  try {
    return body.getReader({ mode: 'byob' });
  } catch {
    return null; // not a byte stream in this browser
  }
}

/**
 * @param {Uint8Array<ArrayBuffer>} bytes
 * @param {string} sha256 hex
 * @param {LoadState} state its stats.hash_ms grows by the digest's time
 */
async function verify(bytes, sha256, state) {
  const t = performance.now();
  const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
  state.stats.hash_ms += performance.now() - t;
  return Array.from(digest, (b) => b.toString(16).padStart(2, '0')).join('') === sha256;
}

/**
 * @param {LoadState} state
 * @param {Job} job
 * @param {number} n bytes of this shard received
 */
function progress(state, job, n) {
  state.received.set(job.shard.path, n);
  let loaded = 0;
  for (const v of state.received.values()) loaded += v;
  state.o.onProgress({ phase: 'download', loaded, total: state.total, file: job.file, shard: job.shard.path });
}

// ---------------------------------------------------------------- fetch, retry, pool

/**
 * @param {string} url
 * @param {RequestInit} init
 * @param {Options} o
 * @param {string} what the file, for messages
 */
async function fetchRetrying(url, init, o, what) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await fetchOnce(url, { ...init, signal: o.signal }, what);
    } catch (e) {
      await backoffOrThrow(e, attempt, o, o.signal, what);
    }
  }
}

/**
 * @param {string} url
 * @param {RequestInit} init
 * @param {string} what the file, for messages
 */
async function fetchOnce(url, init, what) {
  let res;
  try {
    res = await fetch(url, init);
  } catch (e) {
    if (init.signal?.aborted) throw init.signal.reason;
    throw transient(`${what}: network error (${e.message})`, e);
  }
  if (res.ok) return res;
  res.body?.cancel().catch(() => {});
  const retry = res.status >= 500 || res.status === 429 || res.status === 408;
  const hint = res.status === 404 ? ' (the site may have been redeployed: reload the page)' : '';
  const err = new LoadError(`${what}: HTTP ${res.status}${hint}`, { code: 'http', status: res.status, shard: what });
  err.retryable = retry;
  err.retryAfter = Number(res.headers.get('retry-after')) * 1000 || 0;
  throw err;
}

/**
 * @param {string} message
 * @param {unknown} [cause]
 */
function transient(message, cause) {
  const err = new LoadError(message, { code: 'network', cause });
  err.retryable = true;
  return err;
}

/**
 * @param {any} e a caught error: anything may have been thrown
 * @param {number} attempt
 * @param {Options} o
 * @param {AbortSignal} signal
 * @param {string} what the file, for messages
 */
async function backoffOrThrow(e, attempt, o, signal, what) {
  if (signal.aborted) throw signal.reason;
  // Anything that is not our own LoadError (a TypeError from fetch or from a body stream
  // cut mid-way) is a network failure, and worth another try.
  if (!(e instanceof LoadError)) e = transient(`${what}: network error (${e.message})`, e);
  if (!e.retryable || attempt >= o.retries) {
    e.shard ??= what;
    throw e;
  }
  const delay = Math.min(o.maxRetryDelayMs, Math.max(e.retryAfter ?? 0, o.retryDelayMs * 2 ** attempt * (0.5 + Math.random() / 2)));
  o.onWarning({ code: 'retry', shard: what, attempt: attempt + 1, retries: o.retries, delayMs: Math.round(delay),
    message: `${e.message}; retry ${attempt + 1}/${o.retries} in ${Math.round(delay)} ms` });
  await sleep(delay, signal);
}

/**
 * @param {number} ms
 * @param {AbortSignal} signal
 */
function sleep(ms, signal) {
  return /** @type {Promise<void>} */ (new Promise((resolve, reject) => {
    const t = setTimeout(() => { signal.removeEventListener('abort', onAbort); resolve(); }, ms);
    const onAbort = () => { clearTimeout(t); reject(signal.reason); };
    signal.addEventListener('abort', onAbort, { once: true });
  }));
}

// Runs worker over items, `limit` at a time. The first failure aborts the rest, and the call
// settles only after every lane stopped, so nothing writes to the outputs after it returns.
/**
 * @template T
 * @param {T[]} items
 * @param {number} limit
 * @param {(item: T) => Promise<void>} worker
 * @param {AbortController} ctl
 */
async function runPool(items, limit, worker, ctl) {
  let next = 0;
  let failure;
  const lane = async () => {
    while (next < items.length && !ctl.signal.aborted) {
      try {
        await worker(items[next++]);
      } catch (e) {
        failure ??= e;
        ctl.abort(e);
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, lane));
  if (failure) throw failure;
  if (ctl.signal.aborted) throw ctl.signal.reason;
}

/**
 * @param {LoadOptions} opts
 * @returns {Options}
 */
function options(opts) {
  return {
    concurrency: opts.concurrency ?? 4,
    retries: opts.retries ?? 5,
    retryDelayMs: opts.retryDelayMs ?? 500,
    maxRetryDelayMs: opts.maxRetryDelayMs ?? 8000,
    onProgress: opts.onProgress ?? (() => {}),
    onWarning: opts.onWarning ?? ((w) => console.warn(`[webbuild] ${w.message}`)),
    signal: opts.signal ?? new AbortController().signal,
    cacheTimeoutMs: opts.cacheTimeoutMs ?? CACHE_TIMEOUT_MS,
  };
}
