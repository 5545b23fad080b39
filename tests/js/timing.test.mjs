// timing.mjs: the recording pass and its replay, the per-token arithmetic, and the whole of it on real
// Dawn (SwiftShader; skipped without its Vulkan driver) through timing-dawn.mjs, in a child process
// because the Vulkan loader reads its environment at start.
import { describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import {
  gpuCpuPerToken, gpuDecodeRuns, gpuKernelsPerToken, gpuRecordingPass, gpuReplay,
} from '../../webbuild/tools/bench/timing.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const ICD = '/usr/lib/chromium/vk_swiftshader_icd.json';

// A pass that writes down what it is given: the replay's output, as plain data.
function logPass(log, i) {
  const pass = { i, calls: [] };
  log.push(pass);
  for (const m of ['setPipeline', 'setBindGroup', 'dispatchWorkgroups', 'dispatchWorkgroupsIndirect', 'end']) {
    pass[m] = (...args) => pass.calls.push([m, ...args]);
  }
  return pass;
}

describe('recording pass and replay', () => {
  it('replays each dispatch in its own pass with the state set before it', () => {
    let cmds;
    const p = gpuRecordingPass((c) => { cmds = c; }, { label: 'ort' });
    const heap = new Uint32Array([7, 256, 9]);
    p.setPipeline('A');
    p.setBindGroup(0, 'g0', heap, 1, 1);
    p.dispatchWorkgroups(4, 1, 1);
    heap[1] = 0; // the caller's memory, reused after the call: the recorded offsets must not follow it
    p.pushDebugGroup('x');
    p.setPipeline('B');
    p.setBindGroup(1, 'g1');
    p.dispatchWorkgroupsIndirect('buf', 16);
    p.popDebugGroup();
    p.end();
    assert.equal(p.label, 'ort');
    const log = [];
    assert.deepEqual(gpuReplay(cmds, (i) => logPass(log, i)), ['A', 'B']);
    assert.deepEqual(log.map((x) => x.calls), [
      [['setPipeline', 'A'], ['setBindGroup', 0, 'g0', [256]], ['dispatchWorkgroups', 4, 1, 1], ['end']],
      [['setPipeline', 'B'], ['setBindGroup', 0, 'g0', [256]], ['setBindGroup', 1, 'g1'], ['dispatchWorkgroupsIndirect', 'buf', 16], ['end']],
    ]);
  });

  it('an empty pass replays nothing', () => {
    let cmds;
    gpuRecordingPass((c) => { cmds = c; }).end();
    assert.deepEqual(gpuReplay(cmds, () => assert.fail('no pass to open')), []);
  });
});

describe('per token', () => {
  // stamps 0, 10, 30: two steps; a prefill run before the first stamp is not a decode step
  const stamps = [0, 10, 30];
  const runs = [
    { t0: -5, tMap: -4, tMapped: -1, t1: -1 },
    { t0: 1, tMap: 4, tMapped: 8, t1: 9, issueCallMs: 2, issueCalls: 10 },
    { t0: 12, tMap: 17, tMapped: 27, t1: 28, issueCallMs: 3, issueCalls: 12 },
  ];

  it('cuts each step into phases that add up to it', () => {
    assert.deepEqual(gpuCpuPerToken(runs, stamps, 0.05), {
      wall_ms: 15, pre_ms: 1.5, issue_cpu_ms: 4, webgpu_call_ms: 2.5, webgpu_calls: 11, wrapper_us_per_call: 0.05,
      readback_wait_ms: 7, post_ms: 2.5, post_in_run_ms: 1, steps: 2, pipelined: false,
    });
  });

  it('says when a step was issued before the previous token was out (steps queued ahead)', () => {
    // the second step's run starts at 8, before the first step's token at 10
    const queued = [runs[0], runs[1], { ...runs[2], t0: 8 }];
    const t = gpuCpuPerToken(queued, stamps, 0.05);
    assert.equal(t.pipelined, true);
    assert.equal(t.wall_ms, 15); // the phases still add up to the steps; only their cut overlaps
  });

  it('refuses runs that do not match the steps', () => {
    assert.throws(() => gpuDecodeRuns(runs.slice(0, 2), stamps), /1 decoder runs for 2 decode steps/);
    assert.throws(() => gpuCpuPerToken([runs[0], runs[1], { t0: 12 }], stamps, 0), /without a read-back/);
  });

  it('sums kernel ns of the decode runs only, per token, most first', () => {
    const passes = [
      { run: runs[0], kernels: [['A', 1e9]] },
      { run: runs[1], kernels: [['A', 1e6], ['B', 3e6]] },
      { run: runs[2], kernels: [['A', 1e6]] },
    ];
    const r = gpuKernelsPerToken(passes, runs.slice(1));
    assert.deepEqual(r, { gpu_ms: 2.5, kernels_gpu_ms: { B: 1.5, A: 1 } });
    assert.deepEqual(Object.keys(r.kernels_gpu_ms), ['B', 'A']);
  });
});

describe('on Dawn (SwiftShader)', { skip: !existsSync(ICD) && 'no SwiftShader Vulkan driver' }, () => {
  const run = (...args) => JSON.parse(execFileSync(process.execPath, [path.join(HERE, 'timing-dawn.mjs'), ...args], {
    env: { ...process.env, LD_LIBRARY_PATH: '/usr/lib/chromium', VK_ICD_FILENAMES: ICD }, encoding: 'utf8', timeout: 60000,
  }).trim().split('\n').at(-1));

  it('times each kernel with timestamp queries, and the replay computes what the pass did', () => {
    const { plain, timing: t } = run();
    assert.deepEqual(plain, [6, 26, 106]); // x <- (2x + 1) * 2 from 1
    assert.equal(t.gpu_timing, 'timestamp-query'); // the replay's values matched, or it would say so
    assert.equal(t.steps, 3);
    assert.deepEqual(Object.keys(t.kernels_gpu_ms).sort(), ['double', 'inc']);
    assert.ok(t.gpu_ms > 0 && t.kernels_gpu_ms.double > 0 && t.kernels_gpu_ms.inc > 0);
    const sum = t.pre_ms + t.issue_cpu_ms + t.readback_wait_ms + t.post_ms;
    assert.ok(Math.abs(sum - t.wall_ms) < 0.005, `${sum} vs ${t.wall_ms}`); // 4 values rounded to 0.001
    // per step: 8 timed calls before mapAsync (createCommandEncoder ... submit) and more after it
    assert.ok(t.webgpu_calls >= 8 && t.webgpu_call_ms > 0 && t.webgpu_call_ms < t.issue_cpu_ms);
    assert.ok(t.wrapper_us_per_call > 0 && t.wrapper_us_per_call < 5);
    assert.ok(['cpu', 'gpu'].includes(t.bound));
  });

  it('says why without timestamp-query, and keeps the CPU phases', () => {
    const { timing: t } = run('no-timestamps');
    assert.equal(t.gpu_timing, "unavailable: onnxruntime-web's device has no timestamp-query feature");
    assert.equal(t.gpu_ms, undefined);
    assert.equal(t.kernels_gpu_ms, undefined);
    assert.ok(t.issue_cpu_ms > 0 && t.readback_wait_ms > 0);
  });
});
