// runtime/asr.js relativeDiff: the measure longRunsAgree takes to keep or drop the prefill run limit.
// Run: node --test tests/js/
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';

import { relativeDiff } from '../../webbuild/template/runtime/asr.js';

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
