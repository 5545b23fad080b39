// runtime/lora.js against the Python packer (webbuild/site/adapter_pack.py): an adapter file packed in
// each precision reads back as the Python reference unpacks it, bit for bit, in float32 and as float16
// bits (numpy's astype(float16)), and the adapted step form's inputs of every layout kind (lora-encode.js) are
// adapter_pack.step_inputs', bit for bit, made by the same layout records.
// Run: node --test tests/js/
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';

import { floatToHalf } from '../../webbuild/template/runtime/half.js';
import { LoraInputs, loraNames, loraShapes, loraValues } from '../../webbuild/template/runtime/lora.js';
import { PYTHON, REPO, removeTempDir, tempDir } from './fixture.mjs';

// Packs random [K, N] inputs (K not a multiple of 32 among them, values over float16's whole range and
// beyond, one zero outside a band of rows, one all zeros) with adapter_pack.pack; writes per precision the file, its
// `tensors` entry, and what adapter_pack.unpack gives, as float32 and as float16 bits, and step_inputs of that for a
// layout of every kind the page encodes (codes, float32 and float16 scales and values; a joint's rows after its base).
const PACK = `
import json, sys
from pathlib import Path
import numpy as np
from webbuild.site.adapter_pack import pack, step_inputs, unpack
out = Path(sys.argv[1])
rng = np.random.default_rng(0)
inputs = {"lora.0.o_proj.down": rng.normal(0, 0.05, (40, 32)), "lora.0.q_proj.up": rng.normal(0, 3, (32, 24)),
          "lora.1.o_proj.down": np.tile([[0.0, -0.0, 1e-8, 6e-5], [65504, 7e4, -2.0 ** -24, 1 + 2.0 ** -11]] * 16, 8)}
band = np.zeros((96, 24))
band[32:64] = rng.normal(0, 0.5, (32, 24))  # an up of a shared down: its own rows of the group's rank
inputs |= {"lora.0.k_proj.up": band, "lora.2.o_proj.up": np.zeros((32, 8)),
           "lora.0.qkv_proj.down": rng.normal(0, 0.05, (40, 96)),  # 4-bit step codes (a fused norm's reader)
           "lora.1.gate_up_proj.down": rng.normal(0, 0.05, (40, 64)),
           # a joined group (lora.joint_downs): its down in the projection's 4 bits and blocks of 16, its up 8-bit
           "lora.3.down_proj.down": rng.normal(0, 0.05, (40, 32)), "lora.3.down_proj.up": rng.normal(0, 0.5, (32, 24)),
           # a packed group's ups (lora.packed_updates)
           "lora.4.q_proj.up": rng.normal(0, 0.5, (96, 8)), "lora.4.k_proj.up": rng.normal(0, 0.5, (96, 4)),
           "lora.4.v_proj.up": rng.normal(0, 0.5, (96, 4))}
inputs = {k: v.astype(np.float32) for k, v in inputs.items()}
weights = rng.integers(0, 256, 4096, np.uint8)  # the decoder's weights file: the base rows at 8 and 1000
weights.tofile(out / "weights.bin")
def down(name, rank, blocks, bits):
    record = {"kind": "down", "bits": bits, "block": 32, "from": [name]}
    return {name + "_codes": record | {"part": "codes", "dims": [rank, blocks, 32 * bits // 8]},
            name + "_scales": record | {"part": "scales", "dims": [rank, blocks]}}
def layout(size):  # joint: out 24, rows 32 (aligned), then rank 32; K 40 in 3 blocks of 16, two codes a byte
    joint = {"kind": "joint_down", "bits": 4, "block": 16, "rows": 32, "from": ["lora.3.down_proj.down"]}
    up = {"kind": "joint_up", "bits": 8, "block": 32, "rows": 32, "from": ["lora.3.down_proj.up"]}
    base = lambda at, n: {"location": "weights.bin", "offset": at, "length": n}
    return down("lora.0.o_proj.down", 32, 2, 8) | down("lora.1.o_proj.down", 32, 1, 8) \\
        | down("lora.0.qkv_proj.down", 96, 2, 4) | down("lora.1.gate_up_proj.down", 64, 2, 4) | {
        "lora.3.down_proj.joint_codes": joint | {"part": "codes", "dims": [64, 3, 8], "base": base(8, 24 * 3 * 8)},
        "lora.3.down_proj.joint_scales": joint | {"part": "scales", "dims": [64, 3], "base": base(1000, 24 * 3 * size)},
        "lora.3.down_proj.up_codes": up | {"part": "codes", "dims": [24, 2, 32]},
        "lora.3.down_proj.up_scales": up | {"part": "scales", "dims": [24, 2]},
        "lora.4.qkv_proj.up": {"kind": "packed_up", "part": "values", "dims": [96, 16],
                               "from": ["lora.4.q_proj.up", "lora.4.k_proj.up", "lora.4.v_proj.up"]}}
read = lambda name: np.fromfile(out / name, np.uint8)
def page(step, layout):  # what a switch writes: a joint's rows after its base
    return {k: v[layout[k].get("rows", 0):] if layout[k]["kind"] == "joint_down" else v for k, v in step.items()}
for dtype, suffix in ((np.float32, "f32"), (np.float16, "f16")):
    table = layout(np.dtype(dtype).itemsize)
    (out / f"layout.{suffix}.json").write_text(json.dumps(table))
    start = step_inputs({}, table, read, dtype)  # no adapter: the page's buffers as loaded
    (out / f"start.{suffix}").write_bytes(b"".join(v.tobytes() for v in start.values()))
for precision in ("int8", "fp16", "fp32"):
    data, tensors = pack(inputs, precision)
    (out / f"{precision}.bin").write_bytes(data)
    values = unpack(data, tensors, precision)
    (out / f"{precision}.json").write_text(json.dumps({"tensors": tensors, "precision": precision}))
    (out / f"{precision}.f32").write_bytes(b"".join(values[k].tobytes() for k in tensors))
    (out / f"{precision}.f16").write_bytes(b"".join(values[k].astype(np.float16).tobytes() for k in tensors))
    for dtype, suffix in ((np.float32, "f32"), (np.float16, "f16")):
        table = layout(np.dtype(dtype).itemsize)
        step = page(step_inputs(values, table, read, dtype), table)
        (out / f"{precision}.step.{suffix}").write_bytes(b"".join(v.tobytes() for v in step.values()))
`;

let tmp;
before(() => {
  tmp = tempDir();
  execFileSync(PYTHON, ['-c', PACK, tmp], { cwd: REPO, stdio: ['ignore', 'ignore', 'inherit'] });
});
after(() => removeTempDir(tmp));

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
      it(`${precision}: the step inputs of every layout kind in ${dtype} equal adapter_pack.step_inputs`, () => {
        const entry = JSON.parse(readFileSync(path.join(tmp, `${precision}.json`), 'utf8'));
        const layout = JSON.parse(readFileSync(path.join(tmp, `layout.${suffix}.json`), 'utf8'));
        const values = loraValues(read(`${precision}.bin`), entry, dtype, layout);
        const names = Object.keys(layout);
        assert.deepEqual(Object.keys(values).filter((n) => !(n in entry.tensors)), names);
        assert.ok(names.every((n) => values[n] instanceof (layout[n].part === 'codes' ? Uint8Array : dtype === 'float16' ? Uint16Array : Float32Array)));
        const bytes = concat(Uint8Array, names.map((n) => new Uint8Array(values[n].buffer, values[n].byteOffset, values[n].byteLength)));
        assert.deepEqual(bytes, read(`${precision}.step.${suffix}`));
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


  const recording = (seen) => ({ createBuffer: ({ size }) => ({ size }), queue: { writeBuffer: (buffer, at, data) => seen.push([buffer, at, data]) } });

  it('gives the step form its inputs by the layout: a float one shared, codes at the zero point until a switch', async () => {
    const shapes = { 'lora.0.o_proj.down': [40, 32], 'lora.0.o_proj.up': [32, 8] };
    const record = { kind: 'down', bits: 8, block: 32, from: ['lora.0.o_proj.down'] };
    const layout = { 'lora.0.o_proj.down_codes': { ...record, part: 'codes', dims: [32, 2, 32] },
      'lora.0.o_proj.down_scales': { ...record, part: 'scales', dims: [32, 2] },
      'lora.0.o_proj.up': { kind: 'float', part: 'values', dims: [32, 8], from: ['lora.0.o_proj.up'] } };
    const seen = [];
    const inputs = new LoraInputs(ort, shapes, 'float16', recording(seen), { layout });
    const step = inputs.stepFeedsFor(['input_ids', ...Object.keys(layout)]);
    assert.deepEqual(Object.keys(step), Object.keys(layout));
    assert.equal(step['lora.0.o_proj.up'], inputs.feeds['lora.0.o_proj.up']);
    assert.deepEqual([step['lora.0.o_proj.down_codes'].dims, step['lora.0.o_proj.down_codes'].dataType], [[32, 2, 32], 'uint8']);
    assert.deepEqual([step['lora.0.o_proj.down_scales'].dims, step['lora.0.o_proj.down_scales'].dataType], [[32, 2], 'float16']);
    assert.equal(seen.length, 1); // the codes of a zero down, before any adapter
    assert.ok(seen[0][0] === step['lora.0.o_proj.down_codes'].gpuBuffer && seen[0][2].every((c) => c === 128));
    const file = JSON.parse(readFileSync(path.join(tmp, 'fp32.json'), 'utf8'));
    const entry = { ...file, tensors: { 'lora.0.o_proj.down': file.tensors['lora.0.o_proj.down'], 'lora.2.o_proj.up': file.tensors['lora.2.o_proj.up'] } };
    const values = loraValues(read('fp32.bin'), entry, 'float16', layout);
    values['lora.0.o_proj.up'] = new Uint16Array(32 * 8);
    await inputs.set(values);
    const written = new Map(seen.slice(1).map(([buffer, , data]) => [buffer, data]));
    assert.equal(written.get(step['lora.0.o_proj.down_codes'].gpuBuffer), values['lora.0.o_proj.down_codes']);
    assert.equal(written.get(step['lora.0.o_proj.down_scales'].gpuBuffer), values['lora.0.o_proj.down_scales']);
    assert.deepEqual(new LoraInputs({ Tensor: function () {} }, shapes, 'float32').stepFeeds, {}); // wasm: no step form
  });

  for (const [dtype, suffix] of [['float32', 'f32'], ['float16', 'f16']]) {
    it(`gives a joint's step inputs the base rows of the weights file and an identity up (${dtype})`, async () => {
      const all = JSON.parse(readFileSync(path.join(tmp, `layout.${suffix}.json`), 'utf8'));
      const layout = Object.fromEntries(Object.entries(all).filter(([, r]) => r.kind.startsWith('joint')));
      const names = Object.keys(layout);
      const seen = [];
      const weights = read('weights.bin');
      const inputs = new LoraInputs(ort, {}, dtype, recording(seen), { layout, file: (name) => (name === 'weights.bin' ? weights : undefined) });
      const step = inputs.stepFeedsFor(['input_ids', ...names]);
      assert.deepEqual(Object.keys(step), names);
      assert.ok(seen.every(([, at]) => at === 0));
      // what adapter_pack.step_inputs makes without an adapter: the joints' starts, in the layout's order
      const starts = Object.keys(all).map((n) => (n in layout ? seen.find(([b]) => b === step[n].gpuBuffer)[2] : null));
      const expected = read(`start.${suffix}`);
      let at = 0;
      for (const [i, n] of Object.keys(all).entries()) {
        const size = all[n].dims.reduce((a, b) => a * b) * (all[n].part === 'codes' ? 1 : dtype === 'float16' ? 2 : 4);
        if (starts[i]) assert.deepEqual(new Uint8Array(starts[i].buffer, starts[i].byteOffset, starts[i].byteLength), expected.subarray(at, at + size), n);
        at += size;
      }
      // a switch writes the down's rows after the projection's 32, and the whole up
      const values = loraValues(read('fp32.bin'), JSON.parse(readFileSync(path.join(tmp, 'fp32.json'), 'utf8')), dtype, layout);
      seen.length = 0;
      await inputs.set(values);
      const offsets = Object.fromEntries(seen.map(([buffer, offset]) => [names.find((n) => step[n].gpuBuffer === buffer), offset]));
      assert.deepEqual(offsets, { 'lora.3.down_proj.joint_codes': 32 * 3 * 8, 'lora.3.down_proj.joint_scales': 32 * 3 * (dtype === 'float16' ? 2 : 4),
        'lora.3.down_proj.up_codes': 0, 'lora.3.down_proj.up_scales': 0 });
      const missing = new LoraInputs(ort, {}, dtype, recording([]), { layout });
      assert.throws(() => missing.stepFeedsFor(['lora.3.down_proj.joint_codes']), /weights file weights\.bin is not loaded/);
      // a manifest whose base does not fit the input it describes (edited, or of another build)
      const bad = { 'lora.3.down_proj.joint_codes': { ...layout['lora.3.down_proj.joint_codes'], base: { location: 'weights.bin', offset: 8, length: 100 } } };
      const wrong = new LoraInputs(ort, {}, dtype, recording([]), { layout: bad, file: () => weights });
      assert.throws(() => wrong.stepFeedsFor(['lora.3.down_proj.joint_codes']), /manifest lora_layout lora\.3\.down_proj\.down: 100 bytes of base codes in 1536; rebuild the site/);
    });
  }

  it('makes the merged updates with the delta graph, one run per layer, from the adapted inputs into the step\'s', async () => {
    const shapes = {};
    /** the layout records of the merged updates (lora.merged_deltas) */
    const layout = {};
    const delta = { inputNames: ['gate_up_proj.down', 'gate_proj.up', 'up_proj.up'],
      outputNames: ['gate_proj.delta_codes', 'gate_proj.delta_scales', 'up_proj.delta_codes', 'up_proj.delta_scales'],
      run: async (feeds, fetches) => { runs.push([feeds, fetches]); return fetches; } };
    for (const layer of [0, 1]) {
      Object.assign(shapes, { [`lora.${layer}.gate_up_proj.down`]: [64, 6], [`lora.${layer}.gate_proj.up`]: [6, 24],
        [`lora.${layer}.up_proj.up`]: [6, 24] });
      for (const proj of ['gate_proj', 'up_proj']) {
        for (const part of ['codes', 'scales']) {
          layout[`lora.${layer}.${proj}.delta_${part}`] = { kind: 'delta', part, bits: 4, block: 32,
            dims: part === 'codes' ? [24, 2, 16] : [24, 2], from: [`lora.${layer}.gate_up_proj.down`, `lora.${layer}.${proj}.up`],
            delta: { run: layer, from: ['gate_up_proj.down', `${proj}.up`], to: `${proj}.delta_${part}` } };
        }
      }
    }
    const seen = [], runs = [];
    const inputs = new LoraInputs(ort, shapes, 'float16', recording(seen), { layout, delta });
    const names = Object.keys(layout);
    const step = inputs.stepFeedsFor(['input_ids', ...names]);
    assert.deepEqual(Object.keys(step), names);
    assert.deepEqual([step['lora.1.up_proj.delta_codes'].dims, step['lora.1.up_proj.delta_codes'].dataType], [[24, 2, 16], 'uint8']);
    assert.deepEqual([step['lora.1.up_proj.delta_scales'].dims, step['lora.1.up_proj.delta_scales'].dataType], [[24, 2], 'float16']);
    assert.equal(seen.length, 4); // each codes input at the zero point (8, two a byte) until an adapter
    assert.ok(seen.every(([buffer, , data]) => data.every((c) => c === 0x88) && names.some((n) => n.endsWith('codes') && step[n].gpuBuffer === buffer)));
    seen.length = 0;
    const values = Object.fromEntries(Object.entries(shapes).map(([name, [k, n]]) => [name, new Uint16Array(k * n)]));
    await inputs.set(values);
    assert.equal(seen.length, Object.keys(shapes).length); // the adapted graph's inputs only: the merged ones are computed
    assert.equal(runs.length, 2);
    for (const [layer, [feeds, fetches]] of runs.entries()) {
      assert.deepEqual(Object.keys(feeds).sort(), [...delta.inputNames].sort());
      assert.ok(delta.inputNames.every((n) => feeds[n] === inputs.feeds[`lora.${layer}.${n}`]));
      assert.ok(delta.outputNames.every((n) => fetches[n] === step[`lora.${layer}.${n}`]));
    }
    const odd = new LoraInputs(ort, shapes, 'float16', recording([]), { layout, delta: { ...delta, inputNames: ['gate_up_proj.down', 'other.up'] } });
    odd.stepFeedsFor(names);
    await assert.rejects(odd.set(values), /the delta graph's other\.up: not in the manifest's lora_layout; rebuild the site/);
    const none = new LoraInputs(ort, shapes, 'float16', recording([]), { layout });
    assert.throws(() => none.stepFeedsFor(['lora.0.gate_proj.delta_codes']), /ships no delta graph to make it; rebuild the site/);
  });
});
