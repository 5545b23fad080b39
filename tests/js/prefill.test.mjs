// runtime/asr.js relativeDiff: the measure longRunsAgree takes to keep or drop the prefill run limit.
// Run: node --test tests/js/
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { Recogniser, relativeDiff } from '../../webbuild/template/runtime/asr.js';

const f32 = (/** @type {number[]} */ v) => Float32Array.from(v);

describe('relativeDiff', () => {
  it('is the largest difference over the largest magnitude of the first', () => {
    assert.equal(relativeDiff(f32([1, -4, 2]), f32([1, -4, 2])), 0);
    assert.equal(relativeDiff(f32([1, -4, 2]), f32([1.5, -4, 2])), 0.5 / 4);
    assert.equal(relativeDiff(f32([0, 0]), f32([0, 1e-3])) > 1, true); // all zeros: any difference is large
  });

  it('calls a NaN or a length mismatch infinitely far', () => {
    assert.equal(relativeDiff(f32([1, 2]), f32([1, NaN])), Infinity);
    assert.equal(relativeDiff(f32([NaN, 2]), f32([1, 2])), Infinity);
    assert.equal(relativeDiff(f32([1, 2]), f32([1])), Infinity);
  });
});

describe('Recogniser.warmEncoder', () => {
  // a runtime with what warmEncoder reads, and an encoder that returns the samples it was given
  const runtime = /** @type {any} */ ({ sample_rate: 16000, max_chunk_seconds: 30, decoder: {}, io: {},
    webgpu_prefill_chunk: 0 });
  const made = async (/** @type {boolean} */ warmLong) => {
    const r = new Recogniser(/** @type {any} */ ({}), runtime, 'webgpu');
    r.warmLong = warmLong;
    r.encode = async (/** @type {Float32Array} */ pcm) => /** @type {any} */ (pcm.length);
    await r.warmEncoder();
    return r.warmAudio;
  };

  it('encodes a loud 2-s clip and the longest chunk in whole tiles', async () => {
    assert.deepEqual(await made(true), { short: 32000, long: Math.floor(30 * 16000 / 160 / 128) * 128 * 160 });
  });

  it('leaves the longest chunk out where warmLong is false (webbuild bench --warm-up decode)', async () => {
    assert.deepEqual(await made(false), { short: 32000, long: null });
  });
});
