"""The fused decoder graph alone in onnxruntime-web (headless Chromium: SwiftShader WebGPU, and the
wasm EP) against onnxruntime CPU in Python, on the trained example's weights (examples/tiny-asr,
a split source, fused without quantization): last-position logits of a prefill and of decode steps
that feed the KV cache back, and the greedy tokens.

The page drives the graph through the site's own runtime (runtime/asr.js: session options, KV cache
kept on the GPU, input building), not a copy of it. Both Q/K norm forms are checked: "explicit"
(SimplifiedLayerNormalization nodes, what onnxruntime CPU and the wasm EP run) and "gqa" (the norms
inside GroupQueryAttention, what the build emits for WebGPU; its CPU reference is the explicit form).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.example_config import EXAMPLE
from tests.runtime_page import ORT_URL, runtime_page
from webbuild.fusion.fuse_decoder import fuse_decoder, save
from webbuild.fusion.parity import MergedRunner, embed_table, greedy
from webbuild.site.contract import IO
from webbuild.tools.browser import choose, launch

EXAMPLE_MODEL = EXAMPLE / "model"
PREFILL = 24  # < 32: onnxruntime-web 1.30's WebGPU GQA is wrong for runs of 32+ new tokens
STEPS = 8
# Measured (BENCHMARKS.md): SwiftShader WebGPU fp32 within 8.7e-7 of the logits' range, wasm 4.5e-7,
# both forms; 10x that leaves room for a real adapter's summation order and still catches a wrong
# kernel (a 32-token prefill run is off by 0.18 of the range here).
REL_TOL = 1e-5


# gqa-apart: what the build ships for WebGPU (fusion.pack_qkv false: onnxruntime-web fuses the norm
# and the three int4 projections into MatMulNBitsQkv itself; here, unquantized, GQA takes Q, K, V apart)
FORMS = {
    "explicit": {"qk_norm": "explicit"},
    "gqa": {"qk_norm": "gqa"},
    "gqa-apart": {"qk_norm": "gqa", "pack_qkv": False},
}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A folder the page is served from: onnxruntime-web, the site's runtime modules, and the
    example's decoder fused in each form of FORMS (graphs/<form>/)."""
    root = runtime_page(tmp_path_factory.mktemp("decoder-page"), "decoder")
    for form, options in FORMS.items():
        model, _ = fuse_decoder(EXAMPLE_MODEL, **options)
        save(model, root / "graphs" / form)
    shutil.copyfile(EXAMPLE_MODEL / "embed_tokens.bin", root / "graphs" / "embed_tokens.bin")
    return root


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    vocab = embed_table(EXAMPLE_MODEL).shape[0]
    return np.random.default_rng(0).integers(0, vocab, PREFILL).tolist()


@pytest.fixture(scope="module")
def cpu(root, prompt):
    """(last-position logits of the prefill and each step, greedy tokens) on onnxruntime CPU."""
    table = embed_table(EXAMPLE_MODEL)
    logits, tokens = greedy(MergedRunner(root / "graphs" / "explicit" / "decoder.onnx"),
                            table[prompt][None], table, STEPS)
    return np.stack([x[0] for x in logits]), tokens


RUN = """async ({ ortUrl, form, ep, ids, steps, decoder, io }) => {
  const ort = await import(ortUrl);
  const { Recogniser } = await import('./runtime/asr.js');
  const { argmaxLast } = await import('./runtime/greedy.js');
  ort.env.wasm.numThreads = 1;  // no COOP/COEP here
  ort.env.logLevel = 'error';
  const get = async (path) => new Uint8Array(await (await fetch(path)).arrayBuffer());
  const files = new Map([['decoder.onnx', await get(`graphs/${form}/decoder.onnx`)],
    ['decoder.onnx.data', await get(`graphs/${form}/decoder.onnx.data`)],
    ['embed_tokens.bin', await get('graphs/embed_tokens.bin')]]);
  const r = new Recogniser(ort, { decoder, io }, ep);
  try {
    await r.loadDecoder(files, { graph: 'decoder.onnx', data: 'decoder.onnx.data', embed: 'embed_tokens.bin' });
    let { logits, present } = await r.step(r.inputs(ids), ids.length, r.emptyPast());
    const out = {
      logits: [Array.from(logits.data)], tokens: [argmaxLast(logits, decoder.vocab_size)], kv: r.kvLocation,
    };
    for (let i = 0; i < steps; i++) {
      ({ logits, present } = await r.step(r.inputs([out.tokens.at(-1)]), ids.length + i + 1, present));
      out.logits.push(Array.from(logits.data));
      out.tokens.push(argmaxLast(logits, decoder.vocab_size));
    }
    return out;
  } catch (e) {
    return { error: e?.message ?? String(e) };
  }
}"""


@pytest.fixture(scope="module")
def browser_run(playwright, root, prompt):
    """browser_run(form, ep) -> the page's result dict (logits, tokens, kv location, or error)."""
    from webbuild.tools.serve import start

    decoder = json.loads((EXAMPLE_MODEL / "config.json").read_text())["decoder"]
    srv = start(root, quiet=True)
    browser = launch(playwright, choose())
    page = browser.new_page()
    page.goto(srv.url + "index.html")
    done = {}

    def run(form: str, ep: str) -> dict:
        if (form, ep) not in done:
            done[form, ep] = page.evaluate(RUN, {"ortUrl": ORT_URL, "form": form, "ep": ep, "ids": prompt,
                                                 "steps": STEPS, "decoder": decoder, "io": IO.names()})
        return done[form, ep]

    yield run
    browser.close()
    srv.shutdown()


def rel_err(ref: np.ndarray, got: list[list[float]]) -> np.ndarray:
    """Per run: max |ref - got| over the vocabulary, relative to the range of ref's logits."""
    got = np.asarray(got, np.float32)
    return np.abs(ref - got).max(1) / (ref.max(1) - ref.min(1))


@pytest.mark.parametrize("form", list(FORMS))
def test_webgpu_logits_match_onnxruntime_cpu(browser_run, cpu, form):
    ref_logits, ref_tokens = cpu
    out = browser_run(form, "webgpu")
    assert "error" not in out, out.get("error")
    assert out["kv"] == "gpu-buffer"  # the cache really is fed back on the GPU
    err = rel_err(ref_logits, out["logits"])
    print(f"{form} webgpu: max rel err {err.max():.2e} (prefill {err[0]:.2e}, steps {err[1:].max():.2e})")
    assert err.max() < REL_TOL, err
    assert out["tokens"] == ref_tokens


def test_wasm_runs_the_explicit_form_and_rejects_norms_inside_gqa(browser_run, cpu):
    """Why the wasm fallback keeps the explicit form: onnxruntime-web's CPU kernel refuses
    q_norm_weight, as onnxruntime CPU does."""
    ref_logits, ref_tokens = cpu
    out = browser_run("explicit", "wasm")
    assert "error" not in out, out.get("error")
    err = rel_err(ref_logits, out["logits"])
    print(f"explicit wasm: max rel err {err.max():.2e}")
    assert err.max() < REL_TOL and out["tokens"] == ref_tokens
    assert "q_norm_weight" in browser_run("gqa", "wasm").get("error", "")
