"""Adapters saved by PEFT itself (`peft`'s get_peft_model + save_pretrained) on the upstream Qwen3-ASR
model: what model.yaml `adapters:` takes, read as PEFT computes them (names, rank-stabilised scaling), and
PEFT's settings the graph cannot express refused by name."""

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from webbuild.adapters import DECODER_TARGETS, adapter_problems  # noqa: E402
from webbuild.reference.tokenizer import build_tokenizer  # noqa: E402
from webbuild.site.adapter_pack import graph_inputs, update  # noqa: E402
from webbuild.train.lora import TARGET_MODULES, load_adapter  # noqa: E402
from webbuild.train.sentences import load_vocabulary, training_sentences  # noqa: E402
from webbuild.train.train import make_model  # noqa: E402

RANK = 32
BASE = json.loads((Path(__file__).resolve().parents[1] / "examples/tiny-asr/model/config.json").read_text())


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(training_sentences(load_vocabulary()[:200], 300, seed=0), 300)


def peft_adapter(tok, folder: Path, **settings) -> torch.nn.Module:
    """A PEFT LoRA on a fresh tiny Qwen3-ASR, its B matrices made non-zero (PEFT starts them at zero), saved
    to `folder`; the PEFT model."""
    torch.manual_seed(0)
    config = peft.LoraConfig(**{"r": RANK, "lora_alpha": 16, "target_modules": DECODER_TARGETS, **settings})
    model = peft.get_peft_model(make_model(tok).eval(), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    model.save_pretrained(folder)
    return model


@pytest.mark.parametrize("rslora", [False, True])
def test_peft_adapter_fits_and_reads_as_peft_computes_it(tok, tmp_path, rslora):
    model = peft_adapter(tok, tmp_path / "a", use_rslora=rslora)
    assert adapter_problems(tmp_path / "a", BASE) == []
    inputs = graph_inputs(tmp_path / "a", BASE["decoder"]["num_layers"])
    layers = model.base_model.model.model.language_model.layers
    for layer, proj in ((0, "q_proj"), (3, "down_proj")):
        block = layers[layer].self_attn if proj == "q_proj" else layers[layer].mlp
        delta = getattr(block, proj).get_delta_weight("default").detach().numpy()  # [out, in]
        ours = update(inputs, layer, proj)  # [in, out]
        np.testing.assert_allclose(ours, delta.T, rtol=1e-4, atol=1e-6)
    # the training side's reader (python -m webbuild.train.adapt evaluate) computes what PEFT does
    torch.manual_seed(0)
    ours = make_model(tok).eval()
    assert len(load_adapter(ours, tmp_path / "a")) == len(TARGET_MODULES) * BASE["decoder"]["num_layers"]
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        want = model.base_model.model.model.language_model(input_ids=ids).last_hidden_state
        got = ours.model.language_model(input_ids=ids).last_hidden_state
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_peft_leaf_names_also_adapt_the_audio_encoder(tok, tmp_path):
    peft_adapter(tok, tmp_path / "a", target_modules=list(TARGET_MODULES))
    (problem,) = adapter_problems(tmp_path / "a", BASE)
    assert "tensors adapt the audio encoder" in problem and DECODER_TARGETS in problem


def test_peft_dora_is_refused_by_name(tok, tmp_path):
    peft_adapter(tok, tmp_path / "a", use_dora=True)
    problems = adapter_problems(tmp_path / "a", BASE)
    assert problems and problems[0].startswith("adapter_config.json has use_dora: True"), problems
