"""quantize_variants on the tiny zoo export (unfused merged, and fused when fusion is present)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from webbuild.pipeline.check import check_variant, reference_tokens, variant_transcriber
from webbuild.quantize.variants import quantize_variants

CLIPS = {f"noise{i}": (np.random.default_rng(i).standard_normal(12000 + 4000 * i) * 0.1).astype(np.float32)
         for i in range(2)}
MAX_NEW = 8


@pytest.fixture(scope="module")
def merged(zoo_export):
    return zoo_export("merged")


@pytest.fixture(scope="module")
def fused_dir(merged, tmp_path_factory):
    from webbuild.fusion.fuse_decoder import fuse_decoder, save

    out = tmp_path_factory.mktemp("fused")
    for name in ("encoder.onnx", "embed_tokens.bin", "config.json", "tokenizer.json"):
        shutil.copy(merged / name, out / name)
    model, _ = fuse_decoder(merged / "decoder_model_merged.onnx")
    save(model, out)
    return out


@pytest.fixture(scope="module")
def reference(merged):
    return reference_tokens(merged, CLIPS, MAX_NEW)


@pytest.mark.parametrize("source", ["merged", "fused_dir"])
def test_variants_are_written_checked_and_agree_with_the_fp32_reference(source, request, reference, merged,
                                                                       tmp_path):
    src = request.getfixturevalue(source)
    report = quantize_variants(src, tmp_path, encoder_precision="int8")
    cfg = json.loads((merged / "config.json").read_text())
    vocab, hidden = cfg["embed_tokens_shape"]
    for v, elem in (("fp16", TensorProto.FLOAT16), ("fp32", TensorProto.FLOAT)):
        files = report["variants"][v]
        assert (tmp_path / f"decoder.{v}.onnx").is_file() and (tmp_path / f"encoder.{v}.onnx").is_file()
        ops = files["decoder"]["ops"]
        assert ops["GatherBlockQuantized"] == 1 and ops["MatMulNBits"] >= 1 + 7 * cfg["decoder"]["num_layers"] - (
            3 * cfg["decoder"]["num_layers"] if source == "fused_dir" else 0)
        dec = onnx.load(tmp_path / f"decoder.{v}.onnx")
        # no float embedding table anywhere, and the lookup reads lm_head's weight
        assert not [t for t in dec.graph.initializer
                    if t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16)
                    and sorted(t.dims) == sorted([vocab, hidden])]
        types = {i.name: i.type.tensor_type.elem_type for i in dec.graph.input}
        assert types["input_ids"] == TensorProto.INT64 and types["audio_features"] == elem
        assert types["past_key_values.0.key"] == elem
        assert dec.graph.output[0].type.tensor_type.elem_type == elem
        result = check_variant(variant_transcriber(tmp_path, v, merged), CLIPS, reference, MAX_NEW)
        assert result["mean_token_agreement"] >= 0.75, result
    assert report["embeddings"]["tied_shared"]
    # int4 with a shared table: the fp32 decoder is far below the float export
    float_bytes = (merged / "decoder_model_merged.onnx.data").stat().st_size
    assert report["variants"]["fp32"]["decoder"]["bytes"] < float_bytes / 4
    assert report["variants"]["fp16"]["decoder"]["bytes"] < report["variants"]["fp32"]["decoder"]["bytes"]


def test_quantized_logits_stay_close_to_float(merged, tmp_path):
    """Prefill logits of the quantized fp32 and fp16 decoders against the float export (loose bounds)."""
    import onnxruntime as ort

    quantize_variants(merged, tmp_path)
    cfg = json.loads((merged / "config.json").read_text())
    vocab, hidden = cfg["embed_tokens_shape"]
    table = np.fromfile(merged / "embed_tokens.bin", np.float32).reshape(vocab, hidden)
    d = cfg["decoder"]
    ids = np.random.default_rng(7).integers(0, vocab, (1, 10))

    def past(dt):
        return {f"past_key_values.{i}.{k}": np.zeros((1, d["num_key_value_heads"], 0, d["head_dim"]), dt)
                for i in range(d["num_layers"]) for k in ("key", "value")}

    mask = np.ones((1, 10), np.int64)
    ref = ort.InferenceSession(str(merged / "decoder_model_merged.onnx")).run(
        None, {"inputs_embeds": table[ids], "attention_mask": mask, **past(np.float32)})[0][0, -1]
    for v, dt in (("fp32", np.float32), ("fp16", np.float16)):
        out = ort.InferenceSession(str(tmp_path / f"decoder.{v}.onnx")).run(None, {
            "input_ids": ids, "audio_features": np.zeros((1, 0, hidden), dt), "audio_offset": np.array([0]),
            "attention_mask": mask, **past(dt)})[0][0, -1].astype(np.float32)
        assert np.abs(out - ref).max() < 0.5 * np.abs(ref).max(), v
        assert np.corrcoef(out, ref)[0, 1] > 0.9, v


@pytest.mark.parametrize("precision", ["fp16", "int4"])
def test_fp32_variant_encoder_has_no_fp16_compute(merged, precision):
    """The fp32 variant serves adapters without shader-f16: whatever the encoder precision,
    no fp16 tensor may appear in its graph; the fp16 variant does compute in fp16."""
    from webbuild.quantize.encoder import encoder_variant

    def fp16_tensors(model):
        inits = [t for t in model.graph.initializer if t.data_type == TensorProto.FLOAT16]
        casts = [n for n in model.graph.node if n.op_type == "Cast"
                 and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute)]
        return inits + casts

    src = onnx.load(merged / "encoder.onnx")
    assert not fp16_tensors(encoder_variant(onnx.load(merged / "encoder.onnx"), precision, "fp32"))
    assert fp16_tensors(encoder_variant(src, precision, "fp16"))
