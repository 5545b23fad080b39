"""The transformers checkpoint rebuilt from the shipped split export computes what the export computes."""

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")

from onnx import numpy_helper  # noqa: E402

from webbuild.errors import SourceError  # noqa: E402
from webbuild.train.from_export import is_export, load_export, read_graph  # noqa: E402
from webbuild.zoo.export_check import check_export  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny-asr" / "model"


@pytest.fixture(scope="module")
def rebuilt():
    return load_export(EXAMPLE)


@pytest.mark.parametrize("graph", ["encoder.onnx", "decoder_init.onnx", "decoder_step.onnx"])
def test_reader_matches_onnx(graph):
    """The dependency-free reader sees the initializers and MatMul nodes the onnx package sees."""
    ours = read_graph(EXAMPLE / graph)
    ref = onnx.load(str(EXAMPLE / graph))  # external data from the file's folder
    want = {t.name: numpy_helper.to_array(t) for t in ref.graph.initializer}
    assert ours.initializers.keys() == want.keys()
    for name, array in want.items():
        got = ours.initializers[name]
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array), name
    assert [(n.op_type, n.name, list(n.input)) for n in ref.graph.node] == \
        [(n.op_type, n.name, n.inputs) for n in ours.nodes]


def test_rebuilt_model_matches_the_graphs(rebuilt):
    """Upstream torch forward of the rebuilt model vs onnxruntime on encoder, decoder_init and
    decoder_step (the zoo's own export check: audio features, prefill logits, one step)."""
    model, tok = rebuilt
    check_export(EXAMPLE, "qwen3-asr-split", model, tok)


def test_rebuilt_model_ties_and_types(rebuilt):
    model, _ = rebuilt
    assert model.lm_head.weight.data_ptr() == model.model.language_model.embed_tokens.weight.data_ptr()
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    embed = np.fromfile(EXAMPLE / "embed_tokens.bin", np.float32).reshape(model.config.text_config.vocab_size, -1)
    assert np.array_equal(model.model.language_model.embed_tokens.weight.detach().numpy(), embed)


def test_adapt_takes_an_export_as_its_base(tmp_path):
    from webbuild.train.adapt import load_base

    assert is_export(EXAMPLE) and not is_export(tmp_path)
    model, tok = load_base(EXAMPLE)
    ref, _ = load_export(EXAMPLE)
    ours, theirs = model.state_dict(), ref.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert tok.get_vocab_size() == ref.config.text_config.vocab_size


def test_not_an_export(tmp_path):
    with pytest.raises(SourceError, match="missing"):
        load_export(tmp_path)
