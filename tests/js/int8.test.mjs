// runtime/int8.js int8WeightsInWorkers in real Chromium, from a module worker as the site's recogniser runs it:
// the work shared by its own module workers gives the same bytes as int8Weights in one thread (a weight
// whose N is not a multiple of 4 among them). Skipped where no Chromium exists.
//   INT8_SHAPES=1024x3072,1024x151936 INT8_ROUNDS=3 INT8_WORKERS=2 node --test tests/js/int8.test.mjs   the 0.6b's sizes, timed
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';

import { CHROMIUM, runPage } from './chromium.mjs';
import { REPO, removeTempDir, tempDir } from './fixture.mjs';
import { startServer } from '../../webbuild/tools/bench/server.mjs';

describe('int8 weights in workers, in Chromium', { skip: !CHROMIUM && 'no Chromium' }, () => {
  let tmp, srv;
  before(async () => {
    tmp = tempDir();
    srv = await startServer(tmp, { mounts: {
      '/runtime/': path.join(REPO, 'webbuild/template/runtime'), '/page/': path.join(REPO, 'tests/js/browser'),
    } });
  });
  after(async () => {
    await srv?.close();
    removeTempDir(tmp);
  });

  it('shares the derivation among workers, byte for byte', async () => {
    const workers = Number(process.env.INT8_WORKERS ?? 4);
    const shapes = process.env.INT8_SHAPES ?? '1024x3072,1024x16000,80x30';
    const r = await runPage(srv, `${srv.url}page/int8.html?shapes=${shapes}&rounds=${process.env.INT8_ROUNDS ?? 1}&workers=${workers}`,
      path.join(tmp, 'profile'), { timeoutMs: 300000 });
    console.log(JSON.stringify(r));
    assert.equal(r.error, undefined);
    assert.equal(r.workers, workers);
    assert.equal(r.same, true);
  });
});
