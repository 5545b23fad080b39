// The loader in real Chromium with the real Cache API: a second browser start with the same
// profile makes zero shard requests; clearCache empties it; a load through the loader's own worker
// (startLoadInWorker, from a module worker as the site's) hands out files whose bytes verify, and catches a
// corrupt shard. Skipped where no Chromium exists.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import { CHROMIUM, runPage } from './chromium.mjs';
import { REPO, buildFixture, removeTempDir, tempDir } from './fixture.mjs';
import { startServer } from '../../webbuild/tools/bench/server.mjs';

const MAX = 256 * 1024;

describe('loader in Chromium', { skip: !CHROMIUM && 'no Chromium' }, () => {
  let tmp, fx, srv, profile;
  before(async () => {
    tmp = tempDir();
    profile = path.join(tmp, 'profile');
    fx = buildFixture(path.join(tmp, 'fx'), { 'model.onnx.data': 3 * MAX + 5, 'model.onnx': 1000 }, { maxBytes: MAX });
    srv = await startServer(fx.dir, { mounts: {
      '/runtime/': path.join(REPO, 'webbuild/template/runtime'), '/page/': path.join(REPO, 'tests/js/browser'),
    } });
  });
  after(async () => {
    await srv?.close();
    removeTempDir(tmp);
  });
  const shardHits = () => srv.log.filter((r) => r.path.startsWith('/shards/')).length;
  const page = (q) => runPage(srv, `${srv.url}page/page.html?${q}`, profile);

  it('downloads, verifies and caches every shard', async () => {
    const r = await page('action=load');
    assert.equal(r.error, undefined);
    assert.equal(r.filesOk, true);
    assert.equal(r.bytes, 3 * MAX + 5 + 1000);
    assert.equal(r.cacheKeys, fx.manifest.shards.length);
    assert.equal(shardHits(), fx.manifest.shards.length);
  });

  it('serves a browser restart from the Cache API with zero shard requests', async () => {
    srv.log.length = 0;
    const r = await page('action=load');
    assert.equal(r.filesOk, true);
    assert.equal(shardHits(), 0);
    assert.equal(r.lastProgress.loaded, fx.manifest.total_bytes);
  });

  it('clearCache deletes the cache and the next load downloads again', async () => {
    const r = await page(`action=clear&model=${fx.manifest.model_id}`);
    assert.deepEqual({ before: r.before, cleared: r.cleared, after: r.after }, { before: true, cleared: true, after: false });
    srv.log.length = 0;
    assert.equal((await page('action=load')).filesOk, true);
    assert.equal(shardHits(), fx.manifest.shards.length);
  });

  it('works inside a module worker, from the same cache', async () => {
    srv.log.length = 0;
    const r = await page('action=worker');
    assert.equal(r.error, undefined);
    assert.equal(r.filesOk, true);
    assert.deepEqual(r.names.sort(), Object.keys(fx.manifest.files).sort());
    assert.ok(r.progress > fx.manifest.shards.length);
    assert.equal(shardHits(), 0); // the page's previous load cached everything
  });

  // parallel.js in the site's worker's place, a fresh profile each (nothing cached)
  const throughWorker = (name, q = '') => runPage(srv, `${srv.url}page/page.html?action=parallel&mode=worker&check=1${q}`,
    path.join(tmp, name));
  const victim = () => `/${fx.manifest.files['model.onnx.data'].parts[1].shard}`;

  it('loads through the loader worker: the files it transfers verify, a corrupt shard is fetched again', async () => {
    srv.log.length = 0;
    srv.faults.set(victim(), ['corrupt']);
    const r = await throughWorker('profile-lw1');
    assert.equal(r.error, undefined);
    assert.equal(r.filesOk, true);
    assert.equal(r.bytes, 3 * MAX + 5 + 1000);
    assert.deepEqual(r.warnings, [['corrupt', victim().slice(1)]]);
    assert.equal(r.cacheKeys, fx.manifest.shards.length); // the good copy, written once the load was done
    assert.equal(srv.log.filter((x) => x.path === '/runtime/load-worker.js').length, 1);
    assert.equal(shardHits(), fx.manifest.shards.length + 1);
  });

  it('fails a load through the loader worker on a shard that stays corrupt, naming it', async () => {
    srv.faults.set(victim(), ['corrupt', 'corrupt']);
    const r = await throughWorker('profile-lw2');
    assert.match(r.error ?? '', new RegExp(`^LoadError: ${victim().slice(1).replaceAll('.', '\\.')}: sha256 mismatch after re-download`));
    srv.faults.clear();
    srv.log.length = 0;
    const again = await throughWorker('profile-lw2'); // resumes: the shards verified before the failure were cached
    assert.equal(again.filesOk, true);
    assert.ok(shardHits() < fx.manifest.shards.length, `${shardHits()} shard requests`);
  });

  it('loads in the calling thread where the loader worker does not start', async () => {
    srv.log.length = 0;
    srv.faults.set('/runtime/load-worker.js', ['status:404']);
    const r = await throughWorker('profile-lw3');
    srv.faults.clear();
    assert.equal(r.error, undefined);
    assert.equal(r.filesOk, true);
    assert.equal(shardHits(), fx.manifest.shards.length);
  });
});
