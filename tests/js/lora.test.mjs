// runtime/lora.js against the Python packer (webbuild/site/adapter_pack.py): an adapter file packed in
// each precision reads back as the Python reference unpacks it, bit for bit, in float32 and as float16
// bits (numpy's astype(float16)), and its downs' step inputs are adapter_pack.step_downs', bit for bit, and a joined
// group's (lora_form.joint_downs) adapter_pack.joint_inputs'.
// Run: node --test tests/js/
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, rmSync } from 'node:fs';
import path from 'node:path';

import { floatToHalf } from '../../webbuild/template/runtime/half.js';
import { jointValues, LoraInputs, loraNames, loraShapes, loraValues, sideBySide, stepDowns } from '../../webbuild/template/runtime/lora.js';
import { PYTHON, REPO, tempDir } from './fixture.mjs';

// Packs random [K, N] inputs (K not a multiple of 32 among them, values over float16's whole range and
// beyond, one zero outside a band of rows, one all zeros) with adapter_pack.pack; writes per precision the file, its `tensors` entry, and what
// adapter_pack.unpack gives, as float32 and as float16 bits, and step_downs of that (codes, float32 and float16 scales).
const PACK = `
import json, sys
from pathlib import Path
import numpy as np
from webbuild.site.adapter_pack import joint_inputs, pack, step_downs, unpack
from webbuild.site.contract import runtime_names
out = Path(sys.argv[1])
(out / "bits.json").write_text(json.dumps(runtime_names()["lora_down_bits"]))
rng = np.random.default_rng(0)
inputs = {"lora.0.o_proj.down": rng.normal(0, 0.05, (40, 32)), "lora.0.q_proj.up": rng.normal(0, 3, (32, 24)),
          "lora.1.o_proj.down": np.tile([[0.0, -0.0, 1e-8, 6e-5], [65504, 7e4, -2.0 ** -24, 1 + 2.0 ** -11]] * 16, 8)}
band = np.zeros((96, 24))
band[32:64] = rng.normal(0, 0.5, (32, 24))  # an up of a shared down: its own rows of the group's rank
inputs |= {"lora.0.k_proj.up": band, "lora.2.o_proj.up": np.zeros((32, 8)),
           "lora.0.qkv_proj.down": rng.normal(0, 0.05, (40, 96)),  # 4-bit step codes (a fused norm's reader)
           "lora.1.gate_up_proj.down": rng.normal(0, 0.05, (40, 64)),
           # a joined group (lora_form.joint_downs): its down in the projection's 4 bits and blocks of 16, its up 8-bit
           "lora.3.down_proj.down": rng.normal(0, 0.05, (40, 32)), "lora.3.down_proj.up": rng.normal(0, 0.5, (32, 24))}
inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
weights = rng.integers(0, 256, 4096, np.uint8)  # the decoder's weights file: the base rows at 8 and 1000
weights.tofile(out / "weights.bin")
def joint_table(dtype):  # out 24: rows 32 (aligned), then rank 32; K 40 in 3 blocks of 16, two codes a byte
    size = np.dtype(dtype).itemsize
    return {"lora.3.down_proj": {"out": 24, "rows": 32, "rank": 32, "bits": 4, "block": 16, "blocks": 3, "in": 40,
                                 "location": "weights.bin", "codes": [8, 24 * 3 * 8], "scales": [1000, 24 * 3 * size]}}
for dtype, suffix in ((np.float32, "f32"), (np.float16, "f16")):
    table = joint_table(dtype)
    (out / f"joint.{suffix}.json").write_text(json.dumps(table))
    start = joint_inputs({}, table, weights, dtype)  # no adapter: the page's buffers as loaded
    (out / f"joint.start.{suffix}").write_bytes(b"".join(v.tobytes() for v in start.values()))
    (out / f"joint.start.{suffix}.json").write_text(json.dumps(list(start)))
for precision in ("int8", "fp16", "fp32"):
    data, tensors = pack(inputs, precision)
    (out / f"{precision}.bin").write_bytes(data)
    values = unpack(data, tensors, precision)
    (out / f"{precision}.json").write_text(json.dumps({"tensors": tensors, "precision": precision}))
    (out / f"{precision}.f32").write_bytes(b"".join(values[k].tobytes() for k in tensors))
    (out / f"{precision}.f16").write_bytes(b"".join(values[k].astype(np.float16).tobytes() for k in tensors))
    for dtype, suffix in ((np.float32, "f32"), (np.float16, "f16")):
        step = step_downs(values, dtype)
        (out / f"{precision}.step.json").write_text(json.dumps(list(step)))
        (out / f"{precision}.step.{suffix}").write_bytes(b"".join(v.tobytes() for v in step.values()))
        # what a switch writes of a joined group: the down's rows of the joint (from row 32), the up's whole
        joint = joint_inputs(values, joint_table(dtype), weights, dtype)
        page = {k: v[32:] if ".joint_" in k else v for k, v in joint.items()}
        (out / f"{precision}.joint.json").write_text(json.dumps(list(page)))
        (out / f"{precision}.joint.{suffix}").write_bytes(b"".join(v.tobytes() for v in page.values()))
`;

let tmp;
before(() => {
  tmp = tempDir();
  execFileSync(PYTHON, ['-c', PACK, tmp], { cwd: REPO, stdio: ['ignore', 'ignore', 'inherit'] });
});
after(() => rmSync(tmp, { recursive: true, force: true }));

const read = (name) => new Uint8Array(readFileSync(path.join(tmp, name)));
const concat = (Type, arrays) => {
  const out = new Type(arrays.reduce((n, a) => n + a.length, 0));
  let at = 0;
  for (const a of arrays) { out.set(a, at); at += a.length; }
  return out;
};

describe('adapter files', () => {
  for (const precision of ['int8', 'fp16', 'fp32']) {
    it(`${precision}: float32 inputs equal adapter_pack.unpack`, () => {
      const entry = JSON.parse(readFileSync(path.join(tmp, `${precision}.json`), 'utf8'));
      const values = loraValues(read(`${precision}.bin`), entry, 'float32');
      const names = Object.keys(entry.tensors);
      const expected = new Float32Array(read(`${precision}.f32`).buffer);
      assert.deepEqual(concat(Float32Array, names.map((n) => values[n])), expected);
    });

    for (const [dtype, suffix] of [['float32', 'f32'], ['float16', 'f16']]) {
      it(`${precision}: the step form's downs in ${dtype} equal adapter_pack.step_downs`, () => {
        const entry = JSON.parse(readFileSync(path.join(tmp, `${precision}.json`), 'utf8'));
        const values = loraValues(read(`${precision}.bin`), entry, dtype, JSON.parse(readFileSync(path.join(tmp, 'bits.json'), 'utf8')));
        const names = JSON.parse(readFileSync(path.join(tmp, `${precision}.step.json`), 'utf8'));
        assert.deepEqual(Object.keys(values).filter((n) => !(n in entry.tensors)), names);
        assert.ok(names.every((n) => values[n] instanceof (n.endsWith('_codes') ? Uint8Array : dtype === 'float16' ? Uint16Array : Float32Array)));
        const bytes = concat(Uint8Array, names.map((n) => new Uint8Array(values[n].buffer, values[n].byteOffset, values[n].byteLength)));
        assert.deepEqual(bytes, read(`${precision}.step.${suffix}`));
      });
    }

    for (const [dtype, suffix] of [['float32', 'f32'], ['float16', 'f16']]) {
      it(`${precision}: a joined group's step inputs in ${dtype} equal adapter_pack.joint_inputs`, () => {
        const entry = JSON.parse(readFileSync(path.join(tmp, `${precision}.json`), 'utf8'));
        const joint = JSON.parse(readFileSync(path.join(tmp, `joint.${suffix}.json`), 'utf8'));
        const values = loraValues(read(`${precision}.bin`), entry, dtype, {}, joint);
        const names = JSON.parse(readFileSync(path.join(tmp, `${precision}.joint.json`), 'utf8'));
        const made = Object.keys(values).filter((n) => /\.(joint|up)_(codes|scales)$/.test(n));
        assert.deepEqual(made.sort(), [...names].sort());
        assert.ok(!('lora.3.down_proj.down_codes' in values)); // a joined down has no 8-bit step form
        const bytes = concat(Uint8Array, names.map((n) => new Uint8Array(values[n].buffer, values[n].byteOffset, values[n].byteLength)));
        assert.deepEqual(bytes, read(`${precision}.joint.${suffix}`));
      });
    }

    it(`${precision}: float16 inputs are numpy's float16 of them`, () => {
      const entry = JSON.parse(readFileSync(path.join(tmp, `${precision}.json`), 'utf8'));
      const values = loraValues(read(`${precision}.bin`), entry, 'float16');
      const floats = Object.keys(entry.tensors).map((n) => values[n]);
      assert.ok(floats.every((v) => v instanceof Uint16Array));
      assert.deepEqual(concat(Uint16Array, floats), new Uint16Array(read(`${precision}.f16`).buffer));
    });
  }

  it('fills the rows a file does not store with zeros', () => {
    const entry = JSON.parse(readFileSync(path.join(tmp, 'int8.json'), 'utf8'));
    assert.deepEqual(entry.tensors['lora.0.k_proj.up'].rows, [32, 64]);
    assert.deepEqual(entry.tensors['lora.2.o_proj.up'].rows, [0, 0]);
    const values = loraValues(read('int8.bin'), entry);
    const band = values['lora.0.k_proj.up'];
    assert.equal(band.length, 96 * 24);
    assert.ok(band.subarray(0, 32 * 24).every((v) => v === 0) && band.subarray(64 * 24).every((v) => v === 0));
    assert.ok(band.subarray(32 * 24, 64 * 24).some((v) => v !== 0));
    assert.ok(values['lora.2.o_proj.up'].length === 256 && values['lora.2.o_proj.up'].every((v) => v === 0));
  });

  it('reads a file that does not start on a 4-byte boundary (copies instead of viewing)', () => {
    const entry = JSON.parse(readFileSync(path.join(tmp, 'int8.json'), 'utf8'));
    const bytes = read('int8.bin');
    const shifted = new Uint8Array(bytes.length + 1).subarray(1);
    shifted.set(bytes);
    assert.deepEqual(loraValues(shifted, entry), loraValues(bytes, entry));
  });

  it('refuses a precision it cannot read and a file cut short', () => {
    const entry = JSON.parse(readFileSync(path.join(tmp, 'fp32.json'), 'utf8'));
    assert.throws(() => loraValues(read('fp32.bin'), { ...entry, precision: 'int4' }), /precision "int4"/);
    assert.throws(() => loraValues(read('fp32.bin').subarray(0, 100), entry), /runs past its end/);
  });
});

describe('float32 to float16 bits', () => {
  it('rounds to nearest even, keeps signed zeros, subnormals, infinities and NaN', () => {
    const cases = [[0, 0], [-0, 0x8000], [1, 0x3c00], [65504, 0x7bff], [65520, 0x7c00], [1e9, 0x7c00],
      [-Infinity, 0xfc00], [2 ** -24, 0x0001], [2 ** -25, 0], [1.5 * 2 ** -25, 0x0001], [2 ** -14, 0x0400],
      [1 + 2 ** -11, 0x3c00], [1 + 3 * 2 ** -11, 0x3c02], [0.1, 0x2e66]];
    for (const [value, bits] of cases) assert.equal(floatToHalf(value), bits, `${value}`);
    assert.equal(floatToHalf(NaN) & 0x7c00, 0x7c00);
    assert.notEqual(floatToHalf(NaN) & 0x3ff, 0);
  });
});

describe('manifest adapters', () => {
  it('names and shared shapes, none without adapters', () => {
    const tensors = { 'lora.0.q_proj.down': { shape: [256, 32], offset: 0 }, 'lora.0.q_proj.up': { shape: [32, 256], offset: 0 } };
    const manifest = { adapters: { klatt: { file: 'adapter.klatt.bin', tensors }, other: { file: 'adapter.other.bin', tensors } } };
    assert.deepEqual(loraNames(manifest), ['klatt', 'other']);
    assert.deepEqual(loraShapes(manifest), { 'lora.0.q_proj.down': [256, 32], 'lora.0.q_proj.up': [32, 256] });
    assert.deepEqual(loraNames({ variants: {} }), []);
    assert.equal(loraShapes({ variants: {} }), null);
  });
});

describe('adapter inputs on the GPU', () => {
  // what LoraInputs asks of onnxruntime-web and the device, recorded: which rows each switch writes
  const writes = [];
  const device = { createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data, from, count) => writes.push([at, from, count]) } };
  const ort = { Tensor: { fromGpuBuffer: (gpuBuffer, { dims, dataType }) => ({ gpuBuffer, dims, dataType }) } };
  globalThis.GPUBufferUsage ??= { STORAGE: 128, COPY_SRC: 4, COPY_DST: 8 };

  it('writes the rows an adapter stores and the ones the adapter before it filled', async () => {
    const inputs = new LoraInputs(ort, { up: [6, 4] }, 'float32', device);
    const values = { up: new Float32Array(24) };
    await inputs.set(values, { up: [2, 4] });
    await inputs.set(values, { up: [4, 6] }); // another adapter: its rows, and clears 2-4
    await inputs.set(values, { up: [4, 6] });
    await inputs.set(values); // no rows given: all of them
    assert.deepEqual(writes, [[2 * 4 * 4, 8, 8], [2 * 4 * 4, 8, 16], [4 * 4 * 4, 16, 8], [0, 0, 24]]);
  });

  it('gives the step form each down as codes and scales, the ups shared, the codes at the zero point until a switch', async () => {
    const shapes = { 'lora.0.o_proj.down': [40, 32], 'lora.0.o_proj.up': [32, 8] };
    const seen = [];
    const gpu = { createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data) => seen.push([buffer, data]) } };
    const inputs = new LoraInputs(ort, shapes, 'float16', gpu);
    const step = inputs.stepFeedsFor(['input_ids', 'lora.0.o_proj.down_codes', 'lora.0.o_proj.down_scales', 'lora.0.o_proj.up']);
    assert.deepEqual(Object.keys(step), ['lora.0.o_proj.down_codes', 'lora.0.o_proj.down_scales', 'lora.0.o_proj.up']);
    assert.equal(step['lora.0.o_proj.up'], inputs.feeds['lora.0.o_proj.up']);
    assert.deepEqual([step['lora.0.o_proj.down_codes'].dims, step['lora.0.o_proj.down_codes'].dataType], [[32, 2, 32], 'uint8']);
    assert.deepEqual([step['lora.0.o_proj.down_scales'].dims, step['lora.0.o_proj.down_scales'].dataType], [[32, 2], 'float16']);
    assert.equal(seen.length, 1); // the codes of a zero down, before any adapter
    assert.ok(seen[0][0] === step['lora.0.o_proj.down_codes'].gpuBuffer && seen[0][1].every((c) => c === 128));
    const down = new Float32Array(40 * 32).map((_, i) => Math.sin(i));
    const values = { 'lora.0.o_proj.down': new Uint16Array(40 * 32), 'lora.0.o_proj.up': new Uint16Array(32 * 8),
      ...stepDowns('lora.0.o_proj.down', down, [40, 32], 'float16') };
    await inputs.set(values);
    const written = new Map(seen.slice(1).map(([buffer, data]) => [buffer, data]));
    assert.equal(written.get(step['lora.0.o_proj.down_codes'].gpuBuffer), values['lora.0.o_proj.down_codes']);
    assert.equal(written.get(step['lora.0.o_proj.down_scales'].gpuBuffer), values['lora.0.o_proj.down_scales']);
    assert.deepEqual(new LoraInputs({ Tensor: function () {} }, shapes, 'float32').stepFeeds, {}); // wasm: no step form
  });

  for (const [dtype, suffix] of [['float32', 'f32'], ['float16', 'f16']]) {
    it(`gives a joined group's step inputs the base rows of the weights file and an identity up (${dtype})`, async () => {
      const joint = JSON.parse(readFileSync(path.join(tmp, `joint.${suffix}.json`), 'utf8'));
      const seen = [];
      const gpu = { createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data) => seen.push([buffer, at, data]) } };
      const weights = read('weights.bin');
      const inputs = new LoraInputs(ort, {}, dtype, gpu, { joint, file: (name) => (name === 'weights.bin' ? weights : undefined) });
      const names = JSON.parse(readFileSync(path.join(tmp, `joint.start.${suffix}.json`), 'utf8'));
      const step = inputs.stepFeedsFor(['input_ids', ...names]);
      assert.deepEqual(Object.keys(step), names);
      assert.deepEqual(step['lora.3.down_proj.joint_codes'].dims, [64, 3, 8]);
      assert.deepEqual(step['lora.3.down_proj.up_scales'].dims, [24, 2]);
      assert.ok(seen.every(([, at]) => at === 0));
      const bytes = concat(Uint8Array, names.map((n) => seen.find(([b]) => b === step[n].gpuBuffer)[2]).map((d) => new Uint8Array(d.buffer, d.byteOffset, d.byteLength)));
      assert.deepEqual(bytes, read(`joint.start.${suffix}`));
      // a switch writes the down's rows after the projection's 32, and the whole up
      const values = jointValues('lora.3.down_proj.down', new Float32Array(40 * 32).fill(0.5), joint['lora.3.down_proj'], dtype);
      Object.assign(values, jointValues('lora.3.down_proj.up', new Float32Array(32 * 24).fill(-1), joint['lora.3.down_proj'], dtype));
      seen.length = 0;
      await inputs.set(values);
      const at = Object.fromEntries(seen.map(([buffer, offset]) => [names.find((n) => step[n].gpuBuffer === buffer), offset]));
      assert.deepEqual(at, { 'lora.3.down_proj.joint_codes': 32 * 3 * 8, 'lora.3.down_proj.joint_scales': 32 * 3 * (dtype === 'float16' ? 2 : 4),
        'lora.3.down_proj.up_codes': 0, 'lora.3.down_proj.up_scales': 0 });
      const missing = new LoraInputs(ort, {}, dtype, gpu, { joint });
      assert.throws(() => missing.stepFeedsFor(['lora.3.down_proj.joint_codes']), /weights file weights\.bin is not loaded/);
      // a manifest whose span does not fit the rows it describes (edited, or of another build)
      const bad = { 'lora.3.down_proj': { ...joint['lora.3.down_proj'], codes: [8, 100] } };
      const wrong = new LoraInputs(ort, {}, dtype, gpu, { joint: bad, file: () => weights });
      assert.throws(() => wrong.stepFeedsFor(['lora.3.down_proj.joint_codes']), /manifest lora_joint lora\.3\.down_proj: 100 bytes of codes for 24 rows of 24; rebuild the site/);
    });
  }

  it('gives the step form a packed group\'s ups as one input, written side by side at a switch', async () => {
    const shapes = { 'lora.1.qkv_proj.down': [8, 6], 'lora.1.q_proj.up': [6, 4], 'lora.1.k_proj.up': [6, 2],
      'lora.1.v_proj.up': [6, 2] };
    const seen = [];
    const gpu = { createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data) => seen.push([buffer, data]) } };
    const inputs = new LoraInputs(ort, shapes, 'float32', gpu,
      { packed: { qkv_proj: ['q_proj', 'k_proj', 'v_proj'] }, bits: { qkv_proj: 4 } });
    const names = ['lora.1.qkv_proj.down_codes', 'lora.1.qkv_proj.down_scales', 'lora.1.qkv_proj.up'];
    const step = inputs.stepFeedsFor(names);
    assert.deepEqual(Object.keys(step), names); // the members' ups are not the step form's inputs
    assert.deepEqual(step['lora.1.qkv_proj.up'].dims, [6, 8]);
    // a down in a norm's fused kernel (runtime.json lora_down_bits): 4-bit codes, two to a byte, zero point 8
    assert.deepEqual(step['lora.1.qkv_proj.down_codes'].dims, [6, 1, 16]);
    assert.ok(new Map(seen).get(step['lora.1.qkv_proj.down_codes'].gpuBuffer).every((c) => c === 0x88));
    const values = Object.fromEntries(Object.entries(shapes).map(([name, [k, n]], i) =>
      [name, new Float32Array(k * n).map((_, j) => 100 * i + j)]));
    Object.assign(values, stepDowns('lora.1.qkv_proj.down', values['lora.1.qkv_proj.down'], [8, 6], 'float32', 4));
    await inputs.set(values);
    const packed = new Map(seen).get(step['lora.1.qkv_proj.up'].gpuBuffer);
    const row = (name, r, n) => [...values[name].subarray(r * n, (r + 1) * n)];
    for (let r = 0; r < 6; r++) {
      assert.deepEqual([...packed.subarray(r * 8, (r + 1) * 8)],
        [...row('lora.1.q_proj.up', r, 4), ...row('lora.1.k_proj.up', r, 2), ...row('lora.1.v_proj.up', r, 2)]);
    }
    assert.equal(sideBySide([new Float32Array(4), undefined], 2, [2, 2]), undefined); // a member without values
  });

  it('makes a merged group\'s updates with the delta graph, per layer, from the adapted inputs into the step\'s', async () => {
    const shapes = {};
    for (const layer of [0, 1]) {
      Object.assign(shapes, { [`lora.${layer}.gate_up_proj.down`]: [64, 6], [`lora.${layer}.gate_proj.up`]: [6, 24],
        [`lora.${layer}.up_proj.up`]: [6, 24] });
    }
    const seen = [], runs = [];
    const gpu = { createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data) => seen.push([buffer, data]) } };
    // the delta graph's session (webbuild/pipeline/lora_delta.py): its names are the layer's without `lora.{i}.`
    const delta = { inputNames: ['gate_up_proj.down', 'gate_proj.up', 'up_proj.up'],
      outputNames: ['gate_proj.delta_codes', 'gate_proj.delta_scales', 'up_proj.delta_codes', 'up_proj.delta_scales'],
      run: async (feeds, fetches) => { runs.push([feeds, fetches]); return fetches; } };
    const merged = { gate_up_proj: ['gate_proj', 'up_proj'] };
    const inputs = new LoraInputs(ort, shapes, 'float16', gpu, { merged, delta });
    const names = [0, 1].flatMap((l) => delta.outputNames.map((n) => `lora.${l}.${n}`));
    const step = inputs.stepFeedsFor(['input_ids', ...names]);
    assert.deepEqual(Object.keys(step), names);
    assert.deepEqual([step['lora.1.up_proj.delta_codes'].dims, step['lora.1.up_proj.delta_codes'].dataType], [[24, 2, 16], 'uint8']);
    assert.deepEqual([step['lora.1.up_proj.delta_scales'].dims, step['lora.1.up_proj.delta_scales'].dataType], [[24, 2], 'float16']);
    assert.equal(seen.length, 4); // each codes input at the zero point (8, two a byte) until an adapter
    assert.ok(seen.every(([buffer, data]) => data.every((c) => c === 0x88) && names.some((n) => n.endsWith('codes') && step[n].gpuBuffer === buffer)));
    seen.length = 0;
    const values = Object.fromEntries(Object.entries(shapes).map(([name, [k, n]]) => [name, new Uint16Array(k * n)]));
    await inputs.set(values);
    assert.equal(seen.length, Object.keys(shapes).length); // the adapted graph's inputs only: the merged ones are computed
    assert.equal(runs.length, 2);
    for (const [layer, [feeds, fetches]] of runs.entries()) {
      assert.deepEqual(Object.keys(feeds), delta.inputNames);
      assert.ok(delta.inputNames.every((n) => feeds[n] === inputs.feeds[`lora.${layer}.${n}`]));
      assert.ok(delta.outputNames.every((n) => fetches[n] === step[`lora.${layer}.${n}`]));
    }
    const odd = new LoraInputs(ort, shapes, 'float16', gpu, { merged, delta: { ...delta, inputNames: ['gate_up_proj.down', 'other.up'] } });
    odd.stepFeedsFor(names);
    await assert.rejects(odd.set(values), /the delta graph's other\.up: no lora\.0\.other\.up among the adapter's inputs; rebuild the site/);
    const none = new LoraInputs(ort, shapes, 'float16', gpu, { merged });
    assert.throws(() => none.stepFeedsFor(['lora.0.gate_proj.delta_codes']), /ships no delta graph to make it; rebuild the site/);
  });
});
