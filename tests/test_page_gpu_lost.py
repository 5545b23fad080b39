"""The GPU device lost mid-transcription (issue 47), in Chromium on SwiftShader WebGPU: a script put before the site's
worker keeps every GPUDevice the runtime asks for and destroys them at the first token of a file's second chunk. The
page says the GPU stopped working, loads the model again on the CPU, keeps the first chunk's text (decoded on the
GPU) and transcribes the second chunk again there: both texts are the Python reference's."""

from __future__ import annotations

import numpy as np
import pytest

from webbuild.reference.audio import read_wav, write_wav
from webbuild.reference.transcribe import load_transcriber
from webbuild.tools.browser import WORKER, choose, launch, open_page, wait_for, watch
from webbuild.tools.serve import start

pytestmark = pytest.mark.slow  # SwiftShader's WebGPU: about a token a second

# put before worker.js: every device kept; destroyed once the second chunk has its first token (during a decode)
DESTROY = """
if (self.GPUAdapter) {
  const devices = [];
  const request = GPUAdapter.prototype.requestDevice;
  GPUAdapter.prototype.requestDevice = async function (...args) {
    const device = await request.apply(this, args);
    devices.push(device);
    return device;
  };
  const post = self.postMessage.bind(self);
  let second = false, destroyed = false;
  self.postMessage = (msg, ...rest) => {
    post(msg, ...rest);
    if (msg?.type === 'chunk' && msg.index === 1) second = true;
    if (second && !destroyed && msg?.type === 'token') {
      destroyed = true;
      devices.forEach((device) => device.destroy());
    }
  };
}
"""


def test_a_lost_gpu_device_reloads_on_the_cpu_and_keeps_the_text(playwright, example_dist, tmp_path):
    clips = [read_wav(p) for p in sorted((example_dist / "samples").glob("*.wav"))[:2]]
    two = tmp_path / "two.wav"
    write_wav(two, np.concatenate([clips[0], np.zeros(16000, np.float32), clips[1]]))
    reference = load_transcriber(example_dist)
    texts = [reference.text(d.tokens) for d in reference.decode_file(two)]
    srv = start(example_dist, quiet=True)
    browser = launch(playwright, choose(), webgpu=True)
    try:
        context = browser.new_context()

        def prepend(route):
            response = route.fetch()
            route.fulfill(response=response, body=DESTROY + response.text())

        context.route(WORKER, prepend)
        page = context.new_page()
        log = watch(page)
        open_page(page, srv.url + "?ep=webgpu")
        assert page.evaluate("() => window.webbuild.info.ep") == "webgpu"
        page.set_input_files("#file", str(two))
        wait_for(page, "() => window.webbuild.status === 'done' || window.webbuild.error", 600)
        state = page.evaluate("() => window.webbuild")
        assert state["error"] is None and state["recovered"] is True, state
        assert state["info"]["ep"] == "wasm" and page.inner_text("#m-gpu") == "the CPU (no GPU used)"
        assert state["texts"] == texts and len(texts) == 2 and all(texts)
        lost = [w for w in state["warnings"] if w.startswith("The GPU stopped working")]
        assert len(lost) == 2 and "the transcript so far is kept" in lost[0], state["warnings"]
        assert "goes on from the chunk it was in" in page.inner_text("#notice")
        assert page.inner_text("#status").startswith("Done: ")
        assert not log["errors"], log["errors"]
    finally:
        browser.close()
        srv.shutdown()
