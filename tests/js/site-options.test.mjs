// runtime/site.js's reading of the page's options (node --test tests/js/)
import test from 'node:test';
import assert from 'node:assert/strict';
import { GRAPH_OPTIMIZATIONS, graphOptimization } from '../../webbuild/template/runtime/site.js';

test("?opt= takes onnxruntime's levels and falls back to all", () => {
  for (const level of GRAPH_OPTIMIZATIONS) assert.equal(graphOptimization(level), level);
  for (const other of [null, undefined, '', 'ALL', 'fast', '99']) assert.equal(graphOptimization(other), 'all');
});
