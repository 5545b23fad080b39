"""LoRA adapters: a fresh one changes nothing, the folder has PEFT's names and shapes, and an adapter
read back computes what it computed before it was saved."""

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402

from webbuild.adapters import adapter_problems  # noqa: E402
from webbuild.reference.tokenizer import build_tokenizer  # noqa: E402
from webbuild.train.lora import TARGET_MODULES, adapted, attach, load_adapter, save_adapter  # noqa: E402
from webbuild.train.sentences import load_vocabulary, training_sentences  # noqa: E402
from webbuild.train.train import make_model  # noqa: E402

RANK = 32
EXAMPLE_CONFIG = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model" / "config.json"


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(training_sentences(load_vocabulary()[:200], 300, seed=0), 300)


def _model(tok, seed=0):
    torch.manual_seed(seed)
    return make_model(tok).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model.model.language_model(input_ids=ids).last_hidden_state


def test_fresh_adapter_changes_nothing_and_freezes_the_base(tok):
    model = _model(tok)
    ids = torch.randint(0, 300, (2, 9))
    before = _logits(model, ids)
    names = attach(model, RANK, 64.0)
    layers = model.config.text_config.num_hidden_layers
    assert len(names) == layers * len(TARGET_MODULES)
    assert torch.equal(_logits(model, ids), before)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    assert all("language_model" in n for n in trainable)  # the encoder is never adapted


def test_folder_names_shapes_and_config(tok, tmp_path):
    model = _model(tok)
    attach(model, RANK, 64.0)
    save_adapter(model, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (RANK, 64.0, list(TARGET_MODULES))
    with safe_open(str(tmp_path / "a" / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
        a = f.get_tensor("base_model.model.model.language_model.layers.0.mlp.down_proj.lora_A.weight")
        b = f.get_tensor("base_model.model.model.language_model.layers.0.mlp.down_proj.lora_B.weight")
    text = model.config.text_config
    assert a.shape == (RANK, text.intermediate_size) and b.shape == (text.hidden_size, RANK)
    assert a.dtype == torch.float16
    assert len(keys) == 2 * text.num_hidden_layers * len(TARGET_MODULES)
    # what training writes is what model.yaml `adapters:` takes (the test model has the example's decoder)
    assert adapter_problems(tmp_path / "a", json.loads(EXAMPLE_CONFIG.read_text())) == []


def test_saved_adapter_computes_what_it_did(tok, tmp_path):
    model = _model(tok)
    attach(model, RANK, 64.0)
    gen = torch.Generator().manual_seed(1)
    for mod in adapted(model).values():
        # fp16-exact values, so the round trip through the folder is lossless
        mod.lora_B.weight.data = (torch.randn(mod.lora_B.weight.shape, generator=gen) * 0.05).half().float()
        mod.lora_A.weight.data = mod.lora_A.weight.data.half().float()
    ids = torch.randint(0, 300, (2, 9))
    adapted_out, base_out = _logits(model, ids), _logits(_model(tok), ids)
    assert not torch.allclose(adapted_out, base_out, atol=1e-3)
    save_adapter(model, tmp_path / "a")
    fresh = _model(tok)
    load_adapter(fresh, tmp_path / "a")
    assert torch.allclose(_logits(fresh, ids), adapted_out, atol=1e-5)
    off = _model(tok)
    load_adapter(off, tmp_path / "a", scale=0.0)  # model.yaml's scale multiplies the update
    assert torch.allclose(_logits(off, ids), base_out, atol=1e-6)
