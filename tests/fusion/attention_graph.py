"""One small hand-made decoder layer's attention, spelt along each axis exporters differ on, so the
GQA rule is tested on what attention computes rather than on one exporter's spelling.

`attention_graph(**axes)` builds inputs_embeds [1, S, 64], attention_mask, (position_ids), one layer's
past KV -> out (o_proj of the attention), present KV; 4 query heads, 2 KV heads, head size 16. Every
node and inner value gets an opaque random name: the rule must not read them. Only the interface
names (the graph's inputs and outputs) are the ones a decoder has. AXES lists each axis's spellings,
the first being the default; NEGATIVE the spellings that are not GQA's attention.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

HEADS, KV, HD = 4, 2, 16  # GQA on CPU takes head sizes in multiples of 16
D, REP = HEADS * HD, HEADS // KV
MAX_POS = 64
WINDOW = 4  # the sliding_window mask's width, shorter than the prefill plus steps that `run` feeds
THETA = 10000.0
_INT_MAX = 2**63 - 1

AXES = {
    "k_transpose": ("after_repeat", "before_repeat", "before_scale", "none_einsum"),
    "scale": ("scores_mul", "scores_div", "q", "k", "q_and_k", "q_before_rope"),
    "mask": ("where_min_add", "expand_add", "bool_where", "is_causal", "min_float_add", "sliding_window"),
    "repeat_kv": ("expand", "tile"),
    "rope": ("half", "interleaved"),
    "positions": ("given", "derived"),
    "cos_sin": ("computed", "cache"),
    "nan_guard": (False, True),
}
# spellings whose attention GQA cannot compute: the rule must leave them (a static KV cache written in place by
# ScatterND has its own fixture, tests/fusion/static_cache_graph.py)
NEGATIVE = {"mask": ("none", "bias", "strided"), "repeat_kv": ("tile_whole",)}
# a RoPE GQA cannot rebuild as caches (pairs rotated with tables made for rotate_half): it stays as the
# source computes it, and GQA takes Q and K rotated
KEPT_ROPE = {"rope": "pairs_half_tables"}


class Builder:
    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []

    def _name(self) -> str:
        return "t" + "".join(self.rng.choice(list("abcdefghijklmnopqrstuvwxyz0123456789"), 10))

    def c(self, value, dtype=np.int64) -> str:
        name = self._name()
        self.inits.append(onnx.numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = self._name()
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=self._name(), **attrs))
        return out

    def out(self, op_type: str, output: str, *inputs: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], name=self._name(), **attrs))
        return output


def attention_graph(seed: int = 0, **axes) -> ir.Model:
    """The layer with `axes` (AXES or NEGATIVE spellings; unnamed axes take their first spelling)."""
    ax = {k: v[0] for k, v in AXES.items()}
    unknown = set(axes) - set(ax)
    if unknown:
        raise ValueError(f"unknown axes {unknown}")
    ax.update(axes)
    b = Builder(seed)
    w = np.random.default_rng(seed + 1)
    f32 = np.float32

    x = "inputs_embeds"
    q, k, v = (b.op("MatMul", x, b.c(w.standard_normal((D, n)) * 0.3, f32)) for n in (D, KV * HD, KV * HD))
    heads = b.c([0, 0, -1, HD])
    qh, kh, vh = (b.op("Transpose", b.op("Reshape", t, heads), perm=[0, 2, 1, 3]) for t in (q, k, v))

    past_len = b.op("Gather", b.op("Shape", "past_key_values.0.key"), b.c(2), axis=0)
    seq_len = b.op("Gather", b.op("Shape", x), b.c(1), axis=0)
    total = b.op("Add", past_len, seq_len)
    if ax["positions"] == "given":
        pos = "position_ids"
    else:  # past_len .. total - 1, as exports without a position_ids input compute them
        pos = b.op("Unsqueeze", b.op("Range", past_len, total, b.c(1)), b.c([0]))
    cos, sin = cos_sin(b, pos, HD, ax["rope"] == "interleaved", ax["cos_sin"] == "cache")
    cos4, sin4 = (b.op("Unsqueeze", t, b.c([1])) for t in (cos, sin))

    scale = HD ** -0.5
    if ax["scale"] == "q_before_rope":
        qh = b.op("Mul", qh, b.c(scale, f32))
    q_rot, k_rot = (rotate(b, t, HD, ax["rope"] != "half", cos4, sin4) for t in (qh, kh))  # pairs_half_tables: pairs
    k_all = b.out("Concat", "present.0.key", "past_key_values.0.key", k_rot, axis=2)
    v_all = b.out("Concat", "present.0.value", "past_key_values.0.value", vh, axis=2)

    def repeat(t: str, transposed: bool = False) -> str:
        if ax["repeat_kv"] == "tile_whole":
            return b.op("Tile", t, b.c([1, REP, 1, 1]))
        u = b.op("Unsqueeze", t, b.c([2]))
        r = (b.op("Expand", u, b.c([1, 1, REP, 1, 1])) if ax["repeat_kv"] == "expand"
             else b.op("Tile", u, b.c([1, 1, REP, 1, 1])))
        return b.op("Reshape", r, b.c([0, HEADS, HD, -1] if transposed else [0, HEADS, -1, HD]))

    def transpose(t: str) -> str:
        return b.op("Transpose", t, perm=[0, 1, 3, 2])

    if ax["k_transpose"] == "after_repeat":
        kt = transpose(repeat(k_all))
    elif ax["k_transpose"] == "before_repeat":
        kt = repeat(transpose(k_all), transposed=True)
    elif ax["k_transpose"] == "before_scale":  # a factor on K, then the transpose
        kt = transpose(b.op("Mul", repeat(k_all), b.c(1.0, f32)))
    else:  # K as it is: Einsum contracts over hd (and multiplies the probabilities by V too)
        kt = repeat(k_all)
    if ax["scale"] in ("q", "q_and_k"):
        q_rot = b.op("Mul", q_rot, b.c(scale if ax["scale"] == "q" else scale ** 0.5, f32))
    if ax["scale"] in ("k", "q_and_k"):
        kt = b.op("Mul", kt, b.c(scale if ax["scale"] == "k" else scale ** 0.5, f32))
    einsum = ax["k_transpose"] == "none_einsum"
    scores = b.op("Einsum", q_rot, kt, equation="bhsd,bhtd->bhst") if einsum else b.op("MatMul", q_rot, kt)
    if ax["scale"] == "scores_mul":
        scores = b.op("Mul", scores, b.c(scale, f32))
    elif ax["scale"] == "scores_div":
        scores = b.op("Div", scores, b.c(HD ** 0.5, f32))
    scores = _mask(b, scores, past_len, seq_len, total, ax["mask"])
    probs = b.op("Softmax", scores, axis=-1)
    if ax["nan_guard"]:  # SDPA's: fully masked rows give NaN, zeroed
        probs = b.op("Where", b.op("IsNaN", probs), b.c(0.0, f32), probs)
    att = (b.op("Einsum", probs, repeat(v_all), equation="bhst,bhtd->bhsd") if einsum
           else b.op("MatMul", probs, repeat(v_all)))
    merged = b.op("Reshape", b.op("Transpose", att, perm=[0, 2, 1, 3]), b.c([0, 0, D]))
    b.out("MatMul", "out", merged, b.c(w.standard_normal((D, D)) * 0.3, f32))

    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("inputs_embeds", f, ["batch", "seq", D]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "total"])]
    if ax["positions"] == "given":
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]))
    inputs += [helper.make_tensor_value_info(f"past_key_values.0.{n}", f, ["batch", KV, "past", HD])
               for n in ("key", "value")]
    outputs = [helper.make_tensor_value_info("out", f, ["batch", "seq", D])]
    outputs += [helper.make_tensor_value_info(f"present.0.{n}", f, ["batch", KV, "total", HD])
                for n in ("key", "value")]
    g = helper.make_graph(b.nodes, "attention", inputs, outputs, b.inits)
    return ir.from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))


def rotate(b: Builder, t: str, hd: int, interleaved: bool, cos4: str, sin4: str) -> str:
    """RoPE on `t` [B, heads, S, hd]: rotate_half, or pairs (a, b) -> (-b, a) when `interleaved`."""
    if not interleaved:
        lo = b.op("Slice", t, b.c([0]), b.c([hd // 2]), b.c([3]))
        hi = b.op("Slice", t, b.c([hd // 2]), b.c([_INT_MAX]), b.c([3]))
        rot = b.op("Concat", b.op("Neg", hi), lo, axis=-1)
    else:
        even = b.op("Slice", t, b.c([0]), b.c([_INT_MAX]), b.c([-1]), b.c([2]))
        odd = b.op("Slice", t, b.c([1]), b.c([_INT_MAX]), b.c([-1]), b.c([2]))
        pairs = b.op("Concat", b.op("Unsqueeze", b.op("Neg", odd), b.c([-1])), b.op("Unsqueeze", even, b.c([-1])),
                     axis=-1)
        rot = b.op("Reshape", pairs, b.op("Shape", t))
    return b.op("Add", b.op("Mul", t, cos4), b.op("Mul", rot, sin4))


def cos_sin(b: Builder, pos: str, hd: int, interleaved: bool, cache: bool, max_pos: int = MAX_POS) -> tuple[str, str]:
    """cos, sin [B, S, hd] for positions `pos` [B, S], each frequency twice (two halves, or pairs): computed
    from inv_freq, or gathered by position from precomputed tables of `max_pos` rows (`cache`)."""
    inv = 1.0 / THETA ** (np.arange(0, hd, 2) / hd)
    if cache:
        freqs = np.arange(max_pos)[:, None] * inv[None]
        table = np.repeat(freqs, 2, axis=1) if interleaved else np.concatenate([freqs, freqs], axis=1)
        return tuple(b.op("Gather", b.c(fn(table), np.float32), pos, axis=0) for fn in (np.cos, np.sin))
    freqs = b.op("Mul", b.op("Unsqueeze", b.op("Cast", pos, to=TensorProto.FLOAT), b.c([-1])), b.c(inv, np.float32))
    if interleaved:
        pair = b.op("Concat", b.op("Unsqueeze", freqs, b.c([-1])), b.op("Unsqueeze", freqs, b.c([-1])), axis=-1)
        emb = b.op("Reshape", pair, b.c([0, 0, hd]))
    else:
        emb = b.op("Concat", freqs, freqs, axis=-1)
    return b.op("Cos", emb), b.op("Sin", emb)


def _mask(b: Builder, scores: str, past_len: str, seq_len: str, total: str, kind: str) -> str:
    """`scores` with the mask `kind` applied: causal over past + new positions, and padding from
    attention_mask, spelt as different exporters do (NEGATIVE kinds: masks GQA does not compute)."""
    f32 = np.float32
    if kind == "none":
        return scores
    if kind == "is_causal":  # from shapes alone: lower triangle of ones [S, T], offset by the past
        shape = b.op("Concat", b.op("Unsqueeze", seq_len, b.c([0])), b.op("Unsqueeze", total, b.c([0])), axis=0)
        ones = b.op("ConstantOfShape", shape, value=helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0]))
        keep = b.op("Cast", b.op("Trilu", ones, past_len, upper=0), to=TensorProto.BOOL)
        return b.op("Where", keep, scores, b.c(-np.inf, f32))
    qpos = b.op("Unsqueeze", b.op("Range", past_len, total, b.c(1)), b.c([1]))  # [S, 1]
    kpos = b.op("Unsqueeze", b.op("Range", b.c(0), total, b.c(1)), b.c([0]))  # [1, T]
    causal = b.op("LessOrEqual", kpos, qpos)  # [S, T]
    if kind == "sliding_window":  # each position sees the last WINDOW, its own included (Mistral's)
        causal = b.op("And", causal, b.op("Greater", kpos, b.op("Sub", qpos, b.c(WINDOW))))
    if kind == "strided":  # every other position: no window GQA has
        odd = b.op("Equal", b.op("Mod", b.op("Sub", qpos, kpos), b.c(2)), b.c(0))
        causal = b.op("And", causal, odd)
    pad = b.op("Unsqueeze", b.op("Cast", "attention_mask", to=TensorProto.BOOL), b.c([1, 2]))  # [B, 1, 1, T]
    keep = b.op("And", causal, pad)
    if kind in ("where_min_add", "sliding_window", "strided"):
        return b.op("Add", scores, b.op("Where", keep, b.c(0.0, f32), b.c(np.finfo(f32).min, f32)))
    if kind == "min_float_add":  # (1 - keep) * min, as older exporters wrote it
        drop = b.op("Sub", b.c(1.0, f32), b.op("Cast", keep, to=TensorProto.FLOAT))
        return b.op("Add", b.op("Mul", drop, b.c(np.finfo(f32).min, f32)), scores)
    if kind == "bool_where":
        return b.op("Where", keep, scores, b.c(-np.inf, f32))
    if kind == "bias":  # an ALiBi-like bias on top of the causal mask: not droppable
        dist = b.op("Cast", b.op("Sub", kpos, qpos), to=TensorProto.FLOAT)
        bias = b.op("Where", keep, b.op("Mul", dist, b.c(0.5, f32)), b.c(-1e9, f32))
        return b.op("Add", scores, bias)
    if kind == "expand_add":  # padding (1 - m) * -1e9 expanded to [B, 1, S, T], causal added separately
        m = b.op("Cast", "attention_mask", to=TensorProto.FLOAT)
        padf = b.op("Unsqueeze", b.op("Mul", b.op("Sub", b.c(1.0, f32), m), b.c(-1e9, f32)), b.c([1, 2]))
        shape = b.op("Concat", b.c([1, 1]), b.op("Unsqueeze", seq_len, b.c([0])), b.op("Unsqueeze", total, b.c([0])),
                     axis=0)
        causal_f = b.op("Where", causal, b.c(0.0, f32), b.c(-1e9, f32))
        return b.op("Add", b.op("Add", scores, b.op("Expand", padf, shape)), causal_f)
    raise ValueError(f"unknown mask {kind!r}")


def run(model: ir.Model, prefill: int = 5, steps: int = 3, seed: int = 0) -> list[list[np.ndarray]]:
    """Outputs (out, present key, present value) of a prefill of `prefill` positions, then `steps`
    single-position steps fed back the presents, on onnxruntime CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    rng = np.random.default_rng(seed)
    past = [np.zeros((1, KV, 0, HD), np.float32)] * 2
    results = []
    for n in [prefill] + [1] * steps:
        p = past[0].shape[2]
        feeds = {"inputs_embeds": rng.standard_normal((1, n, D)).astype(np.float32),
                 "attention_mask": np.ones((1, p + n), np.int64),
                 "past_key_values.0.key": past[0], "past_key_values.0.value": past[1]}
        if "position_ids" in names:
            feeds["position_ids"] = np.arange(p, p + n, dtype=np.int64)[None]
        outs = sess.run(["out", "present.0.key", "present.0.value"], feeds)
        results.append(outs)
        past = outs[1:]
    return results
