"""The fused encoder (MultiHeadAttention, SkipLayerNormalization, BiasGelu; mel front-end in front)
in onnxruntime-web in headless Chromium, SwiftShader WebGPU and the wasm EP, against onnxruntime CPU
in Python, through the site's own runtime (runtime/asr.js loadEncoder/encode, probe.js webgpuProvider).

Clips longer than 32 audio tokens matter: onnxruntime-web 1.30 runs MultiHeadAttention through its
subgroup flash-attention shader from 32 tokens on, and that shader assumes subgroups of 8+ lanes;
SwiftShader's have 4. The runtime then asks for a device without the subgroups feature; the last test
shows what happens without that.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from tests.example_config import EXAMPLE
from tests.runtime_page import ORT_URL, runtime_page
from webbuild.forms.mel_frontend import add_mel_frontend
from webbuild.fusion.fuse_decoder import save
from webbuild.fusion.fuse_encoder import fuse_encoder
from webbuild.reference.audio import read_wav
from webbuild.reference.mel import DEFAULT_LEAD_MS, lead_samples
from webbuild.site.contract import IO
from webbuild.tools.browser import choose, launch

# Measured: SwiftShader WebGPU within 9.9e-7 of the features' range, wasm 6.9e-7 (BENCHMARKS.md); 100x
# that leaves room for a real adapter's summation order and still catches a wrong kernel (0.1 and more).
REL_TOL = 1e-4
LEAD = lead_samples(DEFAULT_LEAD_MS)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """The page's folder: onnxruntime-web, the site's runtime modules, the example's encoder fused
    (float weights) with the mel front-end in front, its default lead included, as the build assembles it."""
    root = runtime_page(tmp_path_factory.mktemp("encoder-page"), "encoder")
    model, report = fuse_encoder(EXAMPLE / "model")
    assert report["ops_after"]["MultiHeadAttention"] == 4
    save(model, root / "fused", "encoder.onnx")
    add_mel_frontend(root / "fused" / "encoder.onnx", root / "encoder.onnx", LEAD)
    assert (root / "encoder.onnx.data").is_file()  # the weights stay in the fused graph's data file
    return root


@pytest.fixture(scope="module")
def clips() -> list[np.ndarray]:
    """Sample 4 (4.0 s: 53 tokens without the lead, one attention window) and all samples back to
    back (11.5 s: 150 tokens without the lead, two windows)."""
    pcm = [read_wav(p) for p in sorted((EXAMPLE / "samples").glob("*.wav"))]
    return [pcm[3], np.concatenate(pcm)]


@pytest.fixture(scope="module")
def cpu(root, clips) -> list[np.ndarray]:
    sess = ort.InferenceSession(str(root / "encoder.onnx"), providers=["CPUExecutionProvider"])
    return [sess.run(None, {"pcm": c[None].astype(np.float32)})[0] for c in clips]


RUN = """async ({ ortUrl, ep, pcm, plain, io }) => {
  const ort = await import(ortUrl);
  const { Recogniser } = await import('./runtime/asr.js');
  const { webgpuProvider } = await import('./runtime/probe.js');
  ort.env.wasm.numThreads = 1;  // no COOP/COEP here
  ort.env.logLevel = 'error';
  const get = async (name) => new Uint8Array(await (await fetch(name)).arrayBuffer());
  const files = new Map([
    ['encoder.onnx', await get('encoder.onnx')], ['encoder.onnx.data', await get('encoder.onnx.data')],
  ]);
  let provider = ep, adapter = null;
  if (ep === 'webgpu') {
    const a = await navigator.gpu.requestAdapter();
    adapter = { subgroupMinSize: a.info.subgroupMinSize, subgroups: a.features.has('subgroups') };
    if (!plain) provider = await webgpuProvider(a);
  }
  try {
    const r = new Recogniser(ort, { decoder: {}, io }, provider);
    await r.loadEncoder(files, { graph: 'encoder.onnx', data: 'encoder.onnx.data' });
    const features = [];
    for (const x of pcm) {
      const f = await r.encode(Float32Array.from(x));
      features.push({ dims: f.dims, data: Array.from(f.data) });
    }
    return { features, adapter, ownDevice: typeof provider !== 'string' };
  } catch (e) {
    return { error: e?.message ?? String(e) };
  }
}"""


@pytest.fixture(scope="module")
def browser_run(playwright, root, clips):
    """browser_run(ep, plain=False) -> the page's result; each run in a fresh page (its own
    onnxruntime-web instance, so the plain-device run does not share the other's device)."""
    from webbuild.tools.serve import start

    srv = start(root, quiet=True)
    browser = launch(playwright, choose())
    done = {}

    def run(ep: str, plain: bool = False) -> dict:
        if (ep, plain) not in done:
            page = browser.new_page()
            page.goto(srv.url + "index.html")
            done[ep, plain] = page.evaluate(RUN, {"ortUrl": ORT_URL, "ep": ep, "plain": plain, "io": IO.names(),
                                                  "pcm": [c.tolist() for c in clips]})
            page.close()
        return done[ep, plain]

    yield run
    browser.close()
    srv.shutdown()


def rel_errors(cpu: list[np.ndarray], out: dict) -> list[float]:
    errs = []
    for ref, got in zip(cpu, out["features"]):
        assert list(got["dims"]) == list(ref.shape)
        errs.append(float(np.abs(np.asarray(got["data"], np.float32).reshape(ref.shape) - ref).max()
                          / (ref.max() - ref.min())))
    return errs


@pytest.mark.parametrize("ep", ["webgpu", "wasm"])
def test_fused_encoder_matches_onnxruntime_cpu(browser_run, cpu, ep):
    out = browser_run(ep)
    assert "error" not in out, out.get("error")
    assert [f["dims"][1] for f in out["features"]] == [c.shape[1] for c in cpu]
    errs = rel_errors(cpu, out)
    print(f"{ep}: max error of the features' range {max(errs):.1e} ({', '.join(f'{e:.1e}' for e in errs)})")
    assert max(errs) < REL_TOL


def test_small_subgroups_get_their_own_device(browser_run, cpu):
    """SwiftShader's subgroups have 4 lanes: webgpuProvider hands onnxruntime a device without them,
    and with the default device the same graph is wrong from 32 tokens on."""
    out, plain = browser_run("webgpu"), browser_run("webgpu", plain=True)
    assert out["adapter"] == {"subgroupMinSize": 4, "subgroups": True} and out["ownDevice"]
    assert "error" not in plain, plain.get("error")
    errs = rel_errors(cpu, plain)
    print(f"webgpu with subgroups: errors {', '.join(f'{e:.1e}' for e in errs)} of the features' range")
    assert min(errs) > 1e-2
