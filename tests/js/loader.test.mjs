// Loader tests: real shards from webbuild/pipeline/shard.py, served by a real HTTP server, fetched with
// Node's real fetch and checked with real sha256. Run: node --test tests/js/
import { after, before, beforeEach, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import {
  LoadError, MemoryStore, detachBuffer, loadFiles, loadManifest, loadVariant, openModelCache, startLoad,
} from '../../webbuild/template/runtime/loader.js';
import { buildFixture, removeTempDir, tempDir } from './fixture.mjs';
import { startServer } from '../../webbuild/tools/bench/server.mjs';

const KIB = 1024;
const MAX = 64 * KIB;
const SIZES = {
  'decoder.fp16.onnx.data': 5 * MAX + 123, // 6 shards, last one short
  'encoder.onnx': 2 * MAX, // exactly 2 full shards
  'config.json': 300,
  'empty.txt': 0,
};
const NAMES = Object.keys(SIZES);
const FAST = { retryDelayMs: 1, maxRetryDelayMs: 5, onWarning: () => {} };

let tmp, v1, v2, srv;

before(async () => {
  tmp = tempDir();
  v1 = buildFixture(path.join(tmp, 'v1'), SIZES, { maxBytes: MAX, variants: { fp16: ['decoder.fp16.onnx.data', 'config.json'] } });
  // A second build of the same model: only the decoder data changed.
  const keep = { 'encoder.onnx': v1.sources['encoder.onnx'], 'config.json': v1.sources['config.json'], 'empty.txt': v1.sources['empty.txt'] };
  v2 = buildFixture(path.join(tmp, 'v2'), SIZES, { maxBytes: MAX, sources: keep });
  srv = await startServer(v1.dir);
});

after(async () => {
  await srv.close();
  removeTempDir(tmp);
});

beforeEach(() => {
  srv.root = v1.dir;
  srv.faults.clear();
  srv.log.length = 0;
});

const shardsOf = (fx, name) => fx.manifest.files[name].parts.map((p) => `/${p.shard}`);
const allShards = (fx) => fx.manifest.shards.map((s) => `/${s.path}`);
// Shard requests of the latest load (each load starts with the manifest). A fetch aborted by
// an earlier run can still reach the server late; settle() lets such stragglers land first.
const requested = () => srv.log.slice(srv.log.findLastIndex((r) => r.path === '/manifest.json') + 1)
  .filter((r) => r.path.startsWith('/shards/')).map((r) => r.path);
const settle = () => new Promise((r) => setTimeout(r, 30));

function assertSame(files, fx) {
  for (const [name, bytes] of files) assert.ok(Buffer.from(bytes).equals(fx.sources[name]), `${name} differs`);
}

async function load(opts = {}, names = NAMES) {
  const manifest = await loadManifest(srv.url);
  return loadFiles(manifest, names, { cache: null, ...FAST, ...opts });
}

describe('startLoad', () => {
  const start = async (opts = {}) => startLoad(await loadManifest(srv.url), ['encoder.onnx', 'decoder.fp16.onnx.data'],
    { cache: null, ...FAST, ...opts });

  it('gives a file as soon as its own shards are verified, while another still downloads', async () => {
    srv.faults.set(shardsOf(v1, 'decoder.fp16.onnx.data')[0], ['delay:500']);
    const l = await start();
    let done = false;
    l.done.then(() => { done = true; });
    const encoder = await l.ready('encoder.onnx');
    assert.equal(done, false);
    assert.ok(Buffer.from(encoder).equals(v1.sources['encoder.onnx']));
    assertSame(await l.done, v1);
    assert.ok(Buffer.from(await l.ready('decoder.fp16.onnx.data')).equals(v1.sources['decoder.fp16.onnx.data']));
    const { download_ms: download, hash_ms: hash, verified_ms: verified } = l.stats;
    assert.ok(download >= 500 && hash > 0 && verified >= download, JSON.stringify(l.stats));
  });

  it('fails a file still loading with the corrupt shard\'s error, as done', async () => {
    const victim = shardsOf(v1, 'decoder.fp16.onnx.data')[3];
    srv.faults.set(victim, ['corrupt', 'corrupt']);
    const l = await start();
    const check = (e) => e instanceof LoadError && e.code === 'corrupt' && e.message.startsWith(`${victim.slice(1)}: sha256 mismatch`);
    await assert.rejects(l.ready('decoder.fp16.onnx.data'), check);
    await assert.rejects(l.done, check);
  });
});

describe('release', () => {
  it('drops a file from the load once released, and its cache write still holds the bytes', async () => {
    const store = new MemoryStore();
    const l = startLoad(await loadManifest(srv.url), ['encoder.onnx'], { cache: store, deferCache: true, ...FAST });
    await l.ready('encoder.onnx');
    l.release('encoder.onnx');
    assert.equal(l.files.has('encoder.onnx'), false);
    await assert.rejects(l.ready('encoder.onnx'), (e) => e.code === 'unknown-file');
    l.flushCache();
    await l.done;
    const cached = [...store.entries.values()].reduce((n, b) => n + b.length, 0);
    assert.equal(cached, v1.sources['encoder.onnx'].length); // the held writes read the released file's bytes
  });

  it('frees a whole buffer now and leaves a part of one alone', () => {
    const whole = new Uint8Array(1024), part = new Uint8Array(new ArrayBuffer(64)).subarray(8, 16);
    detachBuffer(whole);
    detachBuffer(part);
    detachBuffer(undefined);
    assert.equal(whole.length, 0);
    assert.equal(whole.buffer.byteLength, 0);
    assert.equal(part.length, 8);
  });
});

describe('loading', () => {
  it('reassembles every file byte-exact with one request per shard', async () => {
    const files = await load();
    assert.deepEqual([...files.keys()], NAMES);
    assertSame(files, v1);
    assert.equal(files.get('empty.txt').length, 0);
    assert.deepEqual(requested().sort(), allShards(v1).sort());
  });

  it('gives each file its own exactly-sized buffer', async () => {
    const files = await load();
    for (const [name, bytes] of files) {
      assert.equal(bytes.byteOffset, 0);
      assert.equal(bytes.buffer.byteLength, SIZES[name]);
    }
  });

  it('reports byte progress for download and verify up to the total', async () => {
    const events = [];
    await load({ onProgress: (e) => events.push(e), concurrency: 2 });
    const total = v1.manifest.total_bytes;
    for (const phase of ['download', 'verify']) {
      const ev = events.filter((e) => e.phase === phase);
      assert.ok(ev.length >= v1.manifest.shards.length, phase);
      assert.ok(ev.every((e) => e.total === total && e.loaded <= total && typeof e.file === 'string'));
      assert.equal(ev.at(-1).loaded, total);
    }
    const verified = events.filter((e) => e.phase === 'verify').map((e) => e.loaded);
    assert.deepEqual(verified, [...verified].sort((a, b) => a - b));
    // byte-level: the decoder's full shards arrive in more than one event each
    assert.ok(events.filter((e) => e.phase === 'download').length > v1.manifest.shards.length);
  });

  it('loads a variant and only its shards', async () => {
    const manifest = await loadManifest(srv.url + 'manifest.json');
    const files = await loadVariant(manifest, 'fp16', { cache: null, ...FAST });
    assert.deepEqual([...files.keys()], ['decoder.fp16.onnx.data', 'config.json']);
    assert.deepEqual(requested().sort(), [...shardsOf(v1, 'decoder.fp16.onnx.data'), ...shardsOf(v1, 'config.json')].sort());
    await assert.rejects(loadVariant(manifest, 'int8', FAST), /unknown variant int8; the build has fp16/);
  });

  it('rejects unknown files and foreign manifests', async () => {
    const manifest = await loadManifest(srv.url);
    await assert.rejects(loadFiles(manifest, ['nope.onnx'], FAST), { code: 'unknown-file', message: /nope\.onnx/ });
    await assert.rejects(loadFiles(manifest, ['constructor'], FAST), { code: 'unknown-file' });
    const twice = await loadFiles(manifest, ['config.json', 'config.json'], { cache: null, ...FAST });
    assert.deepEqual([...twice.keys()], ['config.json']);
    srv.faults.set('/manifest.json', ['corrupt']);
    await assert.rejects(loadManifest(srv.url), { code: 'manifest' });
    srv.root = path.join(v1.dir, 'shards');
    await assert.rejects(loadManifest(srv.url), { code: 'http', status: 404 });
  });
});

describe('integrity', () => {
  it('detects a corrupted shard, re-fetches it, and succeeds', async () => {
    const victim = shardsOf(v1, 'decoder.fp16.onnx.data')[2];
    srv.faults.set(victim, ['corrupt']);
    const warnings = [];
    const files = await load({ onWarning: (w) => warnings.push(w) });
    assertSame(files, v1);
    assert.equal(requested().filter((p) => p === victim).length, 2);
    assert.deepEqual(warnings.map((w) => [w.code, w.shard]), [['corrupt', victim.slice(1)]]);
  });

  it('fails naming the shard when it stays corrupt, and caches nothing bad', async () => {
    const victim = shardsOf(v1, 'encoder.onnx')[1];
    srv.faults.set(victim, ['corrupt', 'corrupt']);
    const store = new MemoryStore();
    await assert.rejects(load({ cache: store }), (e) => {
      assert.ok(e instanceof LoadError);
      assert.equal(e.code, 'corrupt');
      assert.equal(e.shard, victim.slice(1));
      assert.match(e.message, new RegExp(`${victim.slice(1).replaceAll('.', '\\.')}: sha256 mismatch`));
      return true;
    });
    assert.ok(!(await store.keys()).some((k) => k.endsWith(victim)));
  });

  it('treats a body longer than the manifest says as corrupt', async () => {
    const manifest = await loadManifest(srv.url);
    const shard = manifest.shards.find((s) => s.path.includes('config.json'));
    shard.size -= 1;
    manifest.files['config.json'].parts[0].length -= 1;
    manifest.files['config.json'].size -= 1;
    await assert.rejects(loadFiles(manifest, ['config.json'], { cache: null, ...FAST }), { code: 'corrupt' });
  });
});

describe('retries', () => {
  it('retries 500 and 429 with backoff, then succeeds', async () => {
    const victim = shardsOf(v1, 'decoder.fp16.onnx.data')[0];
    srv.faults.set(victim, ['status:500', 'status:429', 'status:503']);
    const warnings = [];
    const files = await load({ onWarning: (w) => warnings.push(w) });
    assertSame(files, v1);
    assert.equal(requested().filter((p) => p === victim).length, 4);
    assert.deepEqual(warnings.map((w) => w.code), ['retry', 'retry', 'retry']);
    assert.match(warnings[1].message, /HTTP 429; retry 2\/5/);
  });

  it('gives up after the retry budget with the status in the error', async () => {
    const victim = shardsOf(v1, 'config.json')[0];
    srv.faults.set(victim, Array(3).fill('status:502'));
    await assert.rejects(load({ retries: 2 }), { code: 'http', status: 502, shard: victim.slice(1) });
    assert.equal(requested().filter((p) => p === victim).length, 3);
  });

  it('does not retry a 404 and hints at a redeploy', async () => {
    const manifest = await loadManifest(srv.url);
    const part = manifest.files[NAMES[0]].parts[0];
    manifest.shards.find((s) => s.path === part.shard).path = part.shard = 'shards/gone.0000000000000000.bin';
    await assert.rejects(loadFiles(manifest, [NAMES[0]], { cache: null, ...FAST }), { status: 404, message: /redeployed/ });
    assert.equal(requested().filter((p) => p.includes('gone')).length, 1);
  });

  it('resumes a dropped connection with a Range request', async () => {
    const victim = shardsOf(v1, 'decoder.fp16.onnx.data')[1];
    srv.faults.set(victim, ['cut']);
    const files = await load();
    assertSame(files, v1);
    const hits = srv.log.filter((r) => r.path === victim);
    assert.equal(hits.length, 2);
    assert.equal(hits[0].range, undefined);
    assert.match(hits[1].range, /^bytes=[1-9]\d*-$/);
  });

  it('starts over when the server ignores the Range header', async () => {
    const victim = shardsOf(v1, 'encoder.onnx')[0];
    srv.faults.set(victim, ['cut', 'norange']);
    assertSame(await load(), v1);
    assert.equal(requested().filter((p) => p === victim).length, 2);
  });
});

describe('cache, resume, stale builds', () => {
  it('serves a reload from the cache with zero shard requests', async () => {
    const store = new MemoryStore();
    assertSame(await load({ cache: store }), v1);
    assert.equal(requested().length, v1.manifest.shards.length);
    srv.log.length = 0;
    const events = [];
    assertSame(await load({ cache: store, onProgress: (e) => events.push(e) }), v1);
    assert.equal(requested().length, 0);
    assert.equal(events.filter((e) => e.phase === 'verify').at(-1).loaded, v1.manifest.total_bytes);
  });

  it('re-downloads a cached shard that no longer verifies', async () => {
    const store = new MemoryStore();
    await load({ cache: store });
    const key = [...store.entries.keys()].find((k) => k.includes('encoder'));
    store.entries.get(key)[7] ^= 1;
    srv.log.length = 0;
    const warnings = [];
    assertSame(await load({ cache: store, onWarning: (w) => warnings.push(w) }), v1);
    assert.deepEqual(requested(), [new URL(key).pathname]);
    assert.deepEqual(warnings.map((w) => w.code), ['cache-corrupt']);
  });

  it('after an abort, re-fetches only the shards not yet verified', async () => {
    const store = new MemoryStore();
    const ctl = new AbortController();
    const done = [];
    const onProgress = (e) => {
      if (e.phase !== 'verify') return;
      done.push(`/${e.shard}`);
      if (done.length === 3) ctl.abort(new Error('user left the page'));
    };
    await assert.rejects(load({ cache: store, signal: ctl.signal, onProgress, concurrency: 1 }), /user left the page/);
    assert.equal(done.length, 3);
    await settle();
    const first = requested();
    assertSame(await load({ cache: store, concurrency: 3 }), v1);
    const second = requested();
    assert.deepEqual(second.filter((p) => done.includes(p)), []);
    assert.deepEqual([...new Set([...done, ...second])].sort(), allShards(v1).sort());
    assert.ok(first.length + second.length <= allShards(v1).length + 1); // at most the one in flight twice
  });

  it('after a failed download, a re-run fetches only what is missing', async () => {
    const store = new MemoryStore();
    const victim = shardsOf(v1, 'decoder.fp16.onnx.data')[4];
    srv.faults.set(victim, ['status:503', 'status:503']);
    await assert.rejects(load({ cache: store, retries: 1, concurrency: 2 }), { status: 503 });
    const cached = (await store.keys()).map((k) => new URL(k).pathname);
    assert.ok(cached.length >= 1 && !cached.includes(victim));
    await settle();
    assertSame(await load({ cache: store }), v1);
    assert.deepEqual(requested().sort(), allShards(v1).filter((p) => !cached.includes(p)).sort());
  });

  it('a new build reuses unchanged shards and drops the old ones', async () => {
    const store = new MemoryStore();
    await load({ cache: store });
    srv.root = v2.dir;
    srv.log.length = 0;
    assertSame(await load({ cache: store }), v2);
    const changed = allShards(v2).filter((p) => !allShards(v1).includes(p));
    assert.deepEqual(requested().sort(), changed.sort());
    assert.deepEqual(changed.sort(), shardsOf(v2, 'decoder.fp16.onnx.data').sort());
    const keys = (await store.keys()).map((k) => new URL(k).pathname).sort();
    assert.deepEqual(keys, allShards(v2).sort());
  });

  it('opens one store for several loads of a model, warning once where storage is refused', async () => {
    const store = new MemoryStore();
    assert.equal(await openModelCache('m', { cache: store }), store);
    assert.equal(await openModelCache('m', { cache: null }), null);
    const refusing = { open: async () => { throw new DOMException('denied', 'SecurityError'); } };
    const warnings = [];
    const saved = globalThis.caches;
    globalThis.caches = refusing;
    try {
      assert.equal(await openModelCache('m', { onWarning: (w) => warnings.push(w) }), null);
    } finally {
      globalThis.caches = saved;
    }
    assert.deepEqual(warnings.map((w) => w.code), ['cache-unavailable']);
    const manifest = await loadManifest(srv.url);
    await loadFiles(manifest, ['config.json'], { ...FAST, cache: store });
    await loadFiles(manifest, ['encoder.onnx'], { ...FAST, cache: store });
    const cached = (await store.keys()).map((k) => new URL(k).pathname).sort();
    assert.deepEqual(cached, [...shardsOf(v1, 'config.json'), ...shardsOf(v1, 'encoder.onnx')].sort());
  });

  it('keeps loading without the cache on a quota error and says why', async () => {
    let puts = 0;
    const store = new MemoryStore();
    store.put = async () => { puts++; throw new DOMException('quota exceeded', 'QuotaExceededError'); };
    const warnings = [];
    assertSame(await load({ cache: store, onWarning: (w) => warnings.push(w) }), v1);
    assert.equal(puts, 1);
    assert.deepEqual(warnings.map((w) => w.code), ['quota']);
    assert.match(warnings[0].message, /storage for the site is full.*MiB.*could not be kept/);
  });

  it('downloads every shard once the cache stops answering, and says so once', async () => {
    let reads = 0;
    const store = new MemoryStore();
    store.match = () => { reads++; return new Promise(() => {}); }; // a browser's storage that never answers
    const warnings = [];
    const t0 = performance.now();
    assertSame(await load({ cache: store, cacheTimeoutMs: 50, onWarning: (w) => warnings.push(w) }), v1);
    assert.equal(reads, 4); // the first read of each lane in flight; none after the stall was seen
    assert.deepEqual(warnings.map((w) => w.code), ['cache-unavailable']);
    assert.match(warnings[0].message, /^the browser's cache did not answer in 0\.05 s; the model is downloaded instead$/);
    assert.ok(performance.now() - t0 < 5000);
  });

  it('downloads without the cache where listing it for stale entries never answers', async () => {
    const store = new MemoryStore();
    let reads = 0;
    store.keys = () => new Promise(() => {}); // a storage that stalls before any shard is asked for
    const match = store.match.bind(store);
    store.match = (k) => { reads++; return match(k); };
    const warnings = [];
    assertSame(await load({ cache: store, cacheTimeoutMs: 50, onWarning: (w) => warnings.push(w) }), v1);
    assert.equal(reads, 0); // the cache was left alone for the rest of the load
    assert.deepEqual(warnings.map((w) => w.code), ['cache-unavailable']);
  });
});

describe('limits', () => {
  it('names the file when its buffer cannot be allocated', async () => {
    const manifest = await loadManifest(srv.url);
    manifest.files['config.json'].size = 2 ** 53; // beyond any engine's typed-array limit
    await assert.rejects(loadFiles(manifest, ['config.json'], FAST), { code: 'memory', message: /^config\.json: cannot allocate/ });
  });
});
