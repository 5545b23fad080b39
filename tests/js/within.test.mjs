// The bounded wait (runtime/within.js) the page puts around browser calls that may never answer: the storage's
// cache open (loader.js) and the service worker's registration (app/isolation.js). Run: node --test tests/js/
import { it } from 'node:test';
import assert from 'node:assert/strict';

import { within } from '../../webbuild/template/runtime/within.js';

it('gives the answer that comes in time, and its error', async () => {
  assert.equal(await within(Promise.resolve(7), 1000, 'x'), 7);
  await assert.rejects(within(Promise.reject(new Error('no')), 1000, 'x'), /^Error: no$/);
});

it('names what did not answer once the time is up', async () => {
  const t0 = performance.now();
  await assert.rejects(within(new Promise(() => {}), 50, "the browser's storage"),
    { name: 'TimeoutError', message: "the browser's storage did not answer in 0.05 s" });
  assert.ok(performance.now() - t0 >= 45);
});

it('leaves no timer behind after an early answer', async () => {
  const timers = () => process.getActiveResourcesInfo().filter((r) => r === 'Timeout').length;
  const before = timers();
  await within(Promise.resolve(), 60_000, 'x');
  assert.equal(timers(), before); // a pending 60 s timer would hold a process (a Node script, a test run) open
});
