"""The model zoo writes the published layouts, through both exporters, matching torch."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from webbuild.reference.mel import log_mel  # noqa: E402
from webbuild.reference.prompt import audio_token_count, build_prompt  # noqa: E402
from webbuild.reference.transcribe import load_transcriber  # noqa: E402

SPLIT_FILES = {"encoder.onnx", "decoder_init.onnx", "decoder_step.onnx", "decoder_weights.data",
               "embed_tokens.bin", "config.json", "preprocessor_config.json", "tokenizer.json"}


def io_names(path):
    model = onnx.load(str(path), load_external_data=False)
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_split_layout_files_and_io_names(zoo_export, exporter):
    out = zoo_export("qwen3-asr-split", exporter)
    assert {p.name for p in out.iterdir()} == SPLIT_FILES
    assert io_names(out / "encoder.onnx") == (["mel"], ["audio_features"])
    assert io_names(out / "decoder_init.onnx") == (
        ["input_ids", "position_ids", "audio_features", "audio_offset"], ["logits", "present_keys", "present_values"])
    assert io_names(out / "decoder_step.onnx") == (
        ["input_embeds", "position_ids", "past_keys", "past_values"], ["logits", "present_keys", "present_values"])


def test_split_config_and_embeddings(zoo_export, tiny_model):
    model, tok = tiny_model
    out = zoo_export("qwen3-asr-split")
    cfg = json.loads((out / "config.json").read_text())
    assert {"encoder", "decoder", "mel", "special_tokens"} <= cfg.keys()
    text = model.config.text_config
    assert cfg["embed_tokens_shape"] == [text.vocab_size, text.hidden_size]
    table = np.fromfile(out / "embed_tokens.bin", dtype=cfg["embed_tokens_dtype"]).reshape(cfg["embed_tokens_shape"])
    np.testing.assert_array_equal(table, model.model.language_model.embed_tokens.weight.detach().numpy())
    assert cfg["special_tokens"]["audio_pad_token_id"] == tok.token_to_id("<|audio_pad|>")
    for name in ("<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>", "<asr_text>"):
        assert tok.token_to_id(name) is not None


def test_split_decoders_share_one_weight_file(zoo_export, tiny_model):
    out = zoo_export("qwen3-asr-split")
    locations = set()
    for name in ("decoder_init.onnx", "decoder_step.onnx"):
        model = onnx.load(str(out / name), load_external_data=False)
        locations |= {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    assert locations == {"decoder_weights.data"}
    size = (out / "decoder_weights.data").stat().st_size
    decoder_bytes = 4 * sum(p.numel() for p in tiny_model[0].model.language_model.parameters())
    assert size < 1.6 * decoder_bytes, "decoder weights were stored twice"


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_merged_layout_io_names(zoo_export, exporter, tiny_model):
    out = zoo_export("merged", exporter)
    layers = tiny_model[0].config.text_config.num_hidden_layers
    inputs, outputs = io_names(out / "decoder_model_merged.onnx")
    assert inputs[:2] == ["inputs_embeds", "attention_mask"]
    assert inputs[2:] == [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    assert outputs == ["logits"] + [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]


def torch_greedy(model, tok, mel: torch.Tensor, steps: int) -> list[int]:
    """Greedy tokens from the upstream torch model, recomputing the whole sequence each step."""
    t = mel.shape[2]
    padded = (t + 99) // 100 * 100
    mask = torch.zeros(1, padded, dtype=torch.int64)
    mask[:, :t] = 1
    feats = F.pad(mel, (0, padded - t))
    ids = build_prompt(tok, audio_token_count(t)).ids
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids + out]), input_features=feats, input_features_mask=mask).logits
            out.append(int(logits[0, -1].argmax()))
    return out


def onnx_greedy(model_dir, pcm: np.ndarray, steps: int) -> list[int]:
    runner = load_transcriber(model_dir)
    audio = runner.audio_features(pcm)
    logits, state = runner.decoder.prefill(runner.codec.prompt(audio.shape[1]), audio)
    out = []
    for _ in range(steps):
        out.append(int(np.argmax(logits)))
        logits, state = runner.decoder.step(out[-1], state)
    return out


@pytest.mark.parametrize("layout", ["qwen3-asr-split", "merged"])
def test_greedy_decode_equals_torch(zoo_export, tiny_model, layout):
    model, tok = tiny_model
    pcm = (np.random.RandomState(3).randn(16000 * 2 + 1234) * 0.1).astype(np.float32)
    mel = torch.from_numpy(log_mel(pcm))[None]
    want = torch_greedy(model, tok, mel, steps=12)
    assert onnx_greedy(zoo_export(layout), pcm, steps=12) == want


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_layout_v2_prefill_is_the_split_prefill_on_embeddings(zoo_export, tiny_model, tmp_path, exporter):
    """The v2 converter's decoder_init, fed the split export's own table rows with the audio spliced in,
    gives the last-position logits and the KV of the split decoder_init quantized alike (int4 block 32,
    float activations), whichever exporter made the split graphs."""
    from webbuild.reference.source_v2 import INIT
    from webbuild.reference.transcribe import cpu_session
    from webbuild.zoo.export_v2 import convert
    from webbuild.zoo.published_int4 import quantize_export

    _, tok = tiny_model
    split = zoo_export("qwen3-asr-split", exporter)
    v2 = convert(split, tmp_path / "v2", accuracy_level=0)
    q4 = quantize_export(split, tmp_path / "q4", block_size=32, accuracy_level=0)
    cfg = json.loads((split / "config.json").read_text())
    table = np.fromfile(split / "embed_tokens.bin", np.float32).reshape(cfg["embed_tokens_shape"])
    audio = np.random.default_rng(1).standard_normal((1, 9, table.shape[1]), np.float32)
    prompt = build_prompt(tok, audio.shape[1])
    positions = np.arange(len(prompt.ids), dtype=np.int64)[None]
    want = cpu_session(q4 / "decoder_init.onnx").run(None, {
        "input_ids": np.array([prompt.ids]), "position_ids": positions, "audio_features": audio,
        "audio_offset": np.array([prompt.audio_offset])})
    embeds = table[prompt.ids][None].copy()
    embeds[0, prompt.audio_offset:prompt.audio_offset + audio.shape[1]] = audio[0]
    got = cpu_session(v2 / INIT).run(None, {"input_embeds": embeds, "position_ids": positions})
    np.testing.assert_allclose(got[0], want[0][:, -1:], atol=1e-4)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w, atol=1e-4)


def test_zoo_refuses_existing_output(tmp_path, tiny_model):
    from webbuild.errors import ZooError
    from webbuild.zoo.export import export_model

    with pytest.raises(ZooError, match="already exists"):
        export_model(*tiny_model, tmp_path, "qwen3-asr-split")


def test_zoo_layouts_each_have_an_export_and_a_check():
    from webbuild.layouts import ZOO_LAYOUTS
    from webbuild.zoo.export import DECODER_EXPORTS
    from webbuild.zoo.export_check import DECODER_CHECKS

    assert [e.decoder for e in ZOO_LAYOUTS] == list(DECODER_EXPORTS) == list(DECODER_CHECKS)


def test_zoo_refuses_a_layout_it_does_not_write(tmp_path, tiny_model):
    from webbuild.errors import ZooError
    from webbuild.zoo.export import export_model

    with pytest.raises(ZooError, match="the zoo writes the layouts qwen3-asr-split, merged, not qwen3-asr-v2"):
        export_model(*tiny_model, tmp_path / "v2", "qwen3-asr-v2")
    assert not (tmp_path / "v2").exists()


def test_zoo_layout_old_spelling_writes_the_layout_with_a_deprecation_line(tmp_path, caplog):
    from click.testing import CliRunner

    from webbuild.cli import main

    with caplog.at_level(logging.WARNING):
        result = CliRunner().invoke(main, ["zoo", "tiny", "-o", str(tmp_path / "old"), "--layout", "split"])
    assert result.exit_code == 0, result.output
    assert {p.name for p in (tmp_path / "old").iterdir()} == SPLIT_FILES
    assert "--layout 'split' is deprecated: use 'qwen3-asr-split'" in [r.getMessage() for r in caplog.records]


def _weights_graph(names_values: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Sum of the given initializers (all [4, 300]) plus the input: a graph that only carries weights."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(v, n) for n, v in names_values.items()]
    node = helper.make_node("Sum", ["x", *names_values], ["y"])
    graph = helper.make_graph([node], "w", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 300])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_shared_weights_stream_external_files_once(tmp_path, monkeypatch):
    """Graphs saved one file per tensor (as torchscript writes models over 2 GB) end up in one data
    file, copied in small chunks, equal tensors stored once, and run as before."""
    import onnxruntime as ort

    from webbuild.zoo import onnx_export

    monkeypatch.setattr(onnx_export, "CHUNK", 1000)  # several chunks per tensor
    rng = np.random.RandomState(0)
    shared, own_a, own_b = (rng.randn(4, 300).astype(np.float32) for _ in range(3))
    out = tmp_path / "out"
    out.mkdir()
    with onnx_export.SharedWeights(out / "w.data") as data:
        for name, own in (("a", own_a), ("b", own_b)):
            src = tmp_path / name / "model.onnx"
            src.parent.mkdir()
            onnx.save(_weights_graph({"shared": shared, name: own}), str(src), save_as_external_data=True,
                      all_tensors_to_one_file=False, size_threshold=0)
            data.add_file(src, out / f"{name}.onnx")
    assert (out / "w.data").stat().st_size < 3 * shared.nbytes + 3 * 64, "the shared tensor was stored twice"
    x = np.ones((4, 300), np.float32)
    for name, own in (("a", own_a), ("b", own_b)):
        y = ort.InferenceSession(str(out / f"{name}.onnx")).run(None, {"x": x})[0]
        np.testing.assert_array_equal(y, x + shared + own)


def test_hf_folder_is_the_text_decoder(tmp_path, tiny_model):
    from transformers import Qwen3ForCausalLM

    from webbuild.zoo.build import save_text_decoder_hf

    model, tok = tiny_model
    save_text_decoder_hf(model, tok, tmp_path / "hf")
    lm = Qwen3ForCausalLM.from_pretrained(str(tmp_path / "hf"))
    ids = torch.tensor([[1, 5, 9, 33, 2]])
    with torch.no_grad():
        want = model.lm_head(model.model.language_model(input_ids=ids).last_hidden_state)
        got = lm(ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert lm.config.eos_token_id == [tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")]
