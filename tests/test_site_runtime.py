"""The site runtime's pure modules under Node: streaming detokenising, answer parsing, and variant choice
(chunking: tests/test_chunk.py). (The same modules run in the browser in tests/test_site.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from webbuild.pipeline.render import TEMPLATE_DIR
from webbuild.site.contract import VARIANTS

pytestmark = pytest.mark.skipif(not shutil.which("node"), reason="no node")


def node(script: str):
    """Run an ES module snippet with the runtime folder importable as ./runtime/; returns its JSON."""
    out = subprocess.run(["node", "--input-type=module", "-e", script], cwd=TEMPLATE_DIR,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_streaming_decoder_and_answer_text():
    r = node("""
      import { StreamingDecoder, answerText } from './runtime/tokens.js';
      // table: 0 'lang', 1 '<asr_text>', 2 first two bytes of 'é…' (é = c3 a9), 3 'a9 20 6f 6b', 4 '<|im_end|>'
      const enc = new TextEncoder();
      const pieces = [enc.encode('language English'), enc.encode('<asr_text>'), new Uint8Array([0x68, 0xc3]),
                      new Uint8Array([0xa9, 0x20, 0x6f, 0x6b]), enc.encode('<|im_end|>')];
      const table = { bytes: (id) => pieces[id] };
      const answer = { text_start: '<asr_text>', end: '<|im_end|>' };
      const d = new StreamingDecoder(table), seen = [];
      for (const id of [0, 1, 2, 3, 4]) seen.push(answerText(d.push(id), answer));
      console.log(JSON.stringify({ seen, final: answerText(d.finish(), answer, true),
                                   noMarker: answerText('just text<|im_end|>', answer, true) }));
    """)
    # nothing before the marker; the split 'é' is held back until its second byte arrives
    assert r["seen"] == ["", "", "h", "hé ok", "hé ok"]
    assert r["final"] == "hé ok" and r["noMarker"] == "just text"


# the manifest's variant entries as the build writes them (webbuild.pipeline.state.Variant), and the order
# runtime.json gives: webbuild.site.contract.VARIANTS
MANIFEST = f"const m = {{ variants: {json.dumps(VARIANTS)} }}; const order = {json.dumps(list(VARIANTS))};"


def test_variant_choice():
    r = node(MANIFEST + """
      import { chooseVariant } from './runtime/probe.js';
      const only32 = { variants: { fp32: m.variants.fp32 } };
      const f16 = { gpuAdapter: {}, features: new Set(['shader-f16']) };
      const plain = { gpuAdapter: {}, features: new Set() };
      // a variant the wasm EP may run (providers), not just the last one
      const wasmFirst = { variants: { a: { requires: [], providers: ['wasm'] },
                                      b: { requires: [], providers: ['webgpu'] } } };
      console.log(JSON.stringify([
        chooseVariant(m, f16, undefined, order), chooseVariant(m, plain, undefined, order),
        chooseVariant(m, { gpuAdapter: null }, undefined, order), chooseVariant(m, f16, 'wasm', order),
        chooseVariant(only32, f16, undefined, order),
        chooseVariant(wasmFirst, f16, 'wasm', ['b', 'a']), chooseVariant(wasmFirst, f16, 'webgpu', ['a', 'b']),
      ]));
    """)
    assert r == [{"ep": "webgpu", "variant": "fp16"}, {"ep": "webgpu", "variant": "fp32"},
                 {"ep": "wasm", "variant": "fp32"}, {"ep": "wasm", "variant": "fp32"},
                 {"ep": "webgpu", "variant": "fp32"}, {"ep": "wasm", "variant": "a"}, {"ep": "webgpu", "variant": "b"}]


def test_software_adapter_gets_wasm_unless_webgpu_is_forced():
    r = node(MANIFEST + """
      import { chooseVariant, softwareGpu } from './runtime/probe.js';
      import { choiceNotice } from './runtime/site.js';
      const names = [
        [{ vendor: 'google', architecture: 'swiftshader' }, false],
        [{ description: 'llvmpipe (LLVM 15.0.7, 256 bits)' }, false],
        [{ description: 'Microsoft Basic Render Driver' }, false],
        [{ vendor: 'mesa', device: 'Software Rasterizer' }, false],
        [{ vendor: 'nvidia', architecture: 'hopper' }, true], [{ vendor: 'nvidia', architecture: 'hopper' }, false],
        [{ vendor: 'apple', architecture: 'metal-3' }, false],
      ];
      const soft = { gpuAdapter: {}, features: new Set(['shader-f16']), software: true,
                     description: 'google / swiftshader' };
      const none = { gpuAdapter: null, reason: 'no GPU here' };
      const auto = chooseVariant(m, soft, undefined, order);
      console.log(JSON.stringify({
        software: names.map(([info, fallback]) => softwareGpu(info, fallback)),
        auto, forced: chooseVariant(m, soft, 'webgpu', order), asked: chooseVariant(m, soft, 'wasm', order),
        notes: [choiceNotice(auto, soft), choiceNotice(auto, soft, 'wasm'),
                choiceNotice(chooseVariant(m, none, undefined, order), none),
                choiceNotice(chooseVariant(m, soft, 'webgpu', order), soft, 'webgpu')],
      }));
    """)
    assert r["software"] == [True, True, True, True, True, False, False]  # the fallback flag alone suffices
    assert r["auto"] == {"ep": "wasm", "variant": "fp32"} and r["asked"] == r["auto"]
    assert r["forced"] == {"ep": "webgpu", "variant": "fp16"}  # ?ep=webgpu keeps WebGPU (and shader-f16)
    assert r["notes"] == [
        "This browser offers only a software imitation of a GPU here (google / swiftshader), slower than the CPU, "
        "so the model runs on the CPU. To try it anyway, add ?ep=webgpu to the address.",
        None, "This browser can't use the GPU here, so the model runs on the CPU (slower).", None]


def test_a_device_with_less_memory_than_the_tab_needs_is_told():
    r = node("""
      import { memoryNotice } from './runtime/site.js';
      const fit = { need_bytes: 2 ** 30, budget_bytes: 4 * 2 ** 30, fits: true, tab_bytes: 3 * 2 ** 30 };
      console.log(JSON.stringify([memoryNotice(fit, 2), memoryNotice(fit, 4), memoryNotice(fit, undefined),
                                  memoryNotice({ ...fit, tab_bytes: undefined }, 2), memoryNotice(undefined, 2)]));
    """)
    assert r == ["This model needs up to 3.0 GiB of memory on the CPU; this device reports about 2 GiB, so the page "
                 "may run out of memory.", None, None, None, None]


def test_js_contract_names_equal_the_python_ones():
    from webbuild.pipeline.render import TEMPLATE_DIR
    from webbuild.site.contract import (
        KEEP_AUDIO,
        LIVE_BUTTON,
        LIVE_FROM_WORKER,
        LIVE_TO_WORKER,
        LORA_PICKER,
        RUNTIME_FILE,
        SAMPLES_FILE,
    )

    r = node("""
      import { FROM_WORKER, KEEP_AUDIO, LIVE_BUTTON, LORA_PICKER, RUNTIME_FILE, SAMPLES_FILE, TO_WORKER }
        from './runtime/contract.js';
      console.log(JSON.stringify({ LORA_PICKER, RUNTIME_FILE, SAMPLES_FILE, LIVE_BUTTON, KEEP_AUDIO,
        TO_WORKER, FROM_WORKER }));
    """)
    names = {"LORA_PICKER": LORA_PICKER, "RUNTIME_FILE": RUNTIME_FILE, "SAMPLES_FILE": SAMPLES_FILE,
             "LIVE_BUTTON": LIVE_BUTTON, "KEEP_AUDIO": KEEP_AUDIO}
    assert {k: r[k] for k in names} == names
    assert LIVE_TO_WORKER.items() <= r["TO_WORKER"].items() and LIVE_FROM_WORKER.items() <= r["FROM_WORKER"].items()
    page = (TEMPLATE_DIR / "index.html.j2").read_text()
    assert f'<select id="{LORA_PICKER}"' in page and f'<button type="button" id="{LIVE_BUTTON}"' in page


def test_variant_files_by_graph_through_the_role_table():
    from webbuild.site.contract import FILE_ROLES

    entry = {"files": ["e.onnx", "e.onnx.data", "d.onnx", "d.onnx.data", "d.wasm.onnx"], "requires": [],
             "dtype": "float32", "encoder": "e.onnx", "encoder_data": "e.onnx.data", "decoder": "d.onnx",
             "decoder_data": "d.onnx.data", "decoder_wasm": "d.wasm.onnx"}
    r = node(f"""
      import {{ variantGraphs }} from './runtime/site.js';
      console.log(JSON.stringify(variantGraphs({json.dumps(entry)}, {json.dumps(FILE_ROLES)})));
    """)
    assert r == {"dtype": "float32", "encoder": {"graph": "e.onnx", "data": "e.onnx.data"},
                 "decoder": {"graph": "d.onnx", "data": "d.onnx.data", "wasm": "d.wasm.onnx"}}


def test_adapted_decoder_by_role_with_the_adapters_input_shapes():
    """A variant with the adapted decoder's roles (docs/adapters.md) gets graphs.decoder_lora, and the lora.*
    input shapes from the manifest's adapters (all adapters of a build share them)."""
    from webbuild.site.contract import FILE_ROLES

    entry = {"dtype": "float16", "encoder": "e.onnx", "decoder": "d.onnx", "decoder_data": "d.onnx.data",
             "decoder_step": "d.step.onnx", "decoder_lora": "d.lora.onnx", "decoder_lora_step": "d.lora.step.onnx"}
    tensors = {"lora.0.q_proj.down": {"shape": [256, 32], "offset": 0, "scales_offset": 8192}}
    manifest = {"adapters": {"klatt": {"file": "adapter.klatt.bin", "precision": "int8", "tensors": tensors}}}
    r = node(f"""
      import {{ variantGraphs }} from './runtime/site.js';
      console.log(JSON.stringify(variantGraphs({json.dumps(entry)}, {json.dumps(FILE_ROLES)}, {json.dumps(manifest)})));
    """)
    assert r["decoder_lora"] == {"graph": "d.lora.onnx", "data": "d.onnx.data", "step": "d.lora.step.onnx"}
    assert r["lora"] == {"lora.0.q_proj.down": [256, 32]} and r["decoder"]["step"] == "d.step.onnx"


def test_js_fills_the_graph_name_templates_as_python_does():
    from webbuild.site.contract import IO

    r = node(f"""
      import {{ fill, kvNames }} from './runtime/contract.js';
      const io = {json.dumps(IO.names())};
      console.log(JSON.stringify({{ kv: kvNames(io, 2), lora: fill(io.lora, 1, 'q_proj', 'down') }}));
    """)
    assert r["kv"] == [{"past": p, "present": q} for p, q in zip(IO.pasts(2), IO.presents(2))]
    assert r["lora"] == IO.lora_input(1, "q_proj", "down") == "lora.1.q_proj.down"
