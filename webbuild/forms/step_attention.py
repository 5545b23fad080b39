"""The step form's attention written out for a static KV cache, every kernel dispatched directly (model.yaml
`fusion.step_attention: direct`).

Under graph capture, onnxruntime-web's GroupQueryAttention takes its decode kernels' workgroup counts from the GPU
(`dispatchWorkgroupsIndirect`, one a layer), and Chromium's Dawn validates each indirect dispatch with a pass of its
own: 0.4 ms of GPU wait or more each, a fixed ~20 ms a token on a 28-layer model (docs/graph-capture.md). This rewrite
replaces each GroupQueryAttention of the step form with ops whose sizes are all static:

- the new key and value rows written into the static cache with ScatterND at the step's position (the runtime binds
  `past_key_values.*` and `present.*` to one buffer, and onnxruntime's WebGPU ScatterND copies nothing when its input
  and output are one buffer: the write is in place, as GroupQueryAttention's own);
- q's and k's head norms as SimplifiedLayerNormalization (the attention's scale folded into q's weight), the rotary
  embedding as com.microsoft RotaryEmbedding at the step's position;
- the scores against all T positions as one MatMul of the cache by q's heads ([1, kv, T, hd] x [1, kv, hd, rep]: the
  cache is read as it lies, only q is transposed), the mask's zeros as a bias of the float type's lowest value, then
  Softmax over T and a MatMul by the value cache.

The position, the scatter's indices and the bias are made once a step, from the mask's values, for every layer.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from webbuild.forms.form import NotApplicable
from webbuild.graph.builder import Builder
from webbuild.graph.ir import attr, const, replace

_Q, _K, _V, _PAST_K, _PAST_V, _SEQLENS, _TOTAL, _COS, _SIN = range(9)
_Q_NORM, _K_NORM = 14, 15
_UNSUPPORTED = {"softcap": 0.0, "local_window_size": -1, "smooth_softmax": 0}  # attribute: its only value here


class _Shared:
    """The per-step values every layer reads, made on first use: the position, the scatter's indices for kv heads,
    the mask's bias in a float type."""

    def __init__(self, b: Builder, mask: ir.Value, seqlens: ir.Value):
        self.b, self.mask, self.seqlens = b, mask, seqlens
        self._pos: ir.Value | None = None
        self._indices: dict[int, ir.Value] = {}
        self._bias: dict[ir.DataType, ir.Value] = {}

    def pos(self) -> ir.Value:
        """The step's position, int64 [1, 1] (seqlens_k: the ones of the mask less one)."""
        if self._pos is None:
            i64 = ir.DataType.INT64
            cast = self.b.op("Cast", [self.seqlens], i64, (1,), to=i64)
            self._pos = self.b.op("Reshape", [cast, self.b.const("shape_1_1", np.array([1, 1], np.int64))], i64, (1, 1))
        return self._pos

    def indices(self, kv: int) -> ir.Value:
        """ScatterND's indices into [1, kv, T, hd]: (0, head, position) for each of the kv heads, [kv, 3]."""
        if kv not in self._indices:
            i64, b = ir.DataType.INT64, self.b
            heads = b.const(f"heads_{kv}", np.stack([np.zeros(kv), np.arange(kv)], axis=1).astype(np.int64))
            at = b.op("Expand", [self.pos(), b.const(f"shape_{kv}_1", np.array([kv, 1], np.int64))], i64, (kv, 1))
            self._indices[kv] = b.op("Concat", [heads, at], i64, (kv, 3), axis=1)
        return self._indices[kv]

    def bias(self, dtype: ir.DataType) -> ir.Value:
        """0 where the mask is 1, the type's lowest value where it is 0: [1, 1, T, 1]."""
        if dtype not in self._bias:
            b, np_type = self.b, dtype.numpy()
            zero = b.const(f"zero_{dtype.name}", np.array(0, np_type))
            low = b.const(f"lowest_{dtype.name}", np.array(np.finfo(np_type).min, np_type))
            off = b.op("Equal", [self.mask, b.const("zero_i64", np.array(0, np.int64))], ir.DataType.BOOL)
            flat = b.op("Where", [off, low, zero], dtype)
            self._bias[dtype] = b.op("Reshape", [flat, b.const("shape_bias", np.array([1, 1, -1, 1], np.int64))], dtype)
        return self._bias[dtype]


def direct_attention(graph: ir.Graph, mask: ir.Value, seqlens: ir.Value) -> int:
    """Replace every GroupQueryAttention of the step form `graph` (its inputs as step_form leaves them: seqlens_k from
    the mask's values) as the module docstring says; returns how many. NotApplicable where one uses what this
    spelling does not reproduce (a soft cap, a local window, smooth softmax, packed QKV without static sizes)."""
    nodes = [n for n in graph.all_nodes() if n.op_type == "GroupQueryAttention"]
    shared = _Shared(Builder(graph, "step/attention/"), mask, seqlens)
    for node in nodes:
        b = Builder(graph, f"{node.name}/direct/", const_prefix="step/attention/")
        _replace(b, shared, node)
        graph.insert_before(node, [*shared.b.nodes, *b.nodes])
        shared.b.nodes.clear()
        graph.remove(node, safe=True)
    return len(nodes)


def _replace(b: Builder, shared: _Shared, n: ir.Node) -> None:
    for name, only in _UNSUPPORTED.items():
        if attr(n, name, only) != only:
            raise NotApplicable(f"{n.name}: {name} {attr(n, name, only)} (the direct step attention has none)")
    heads, kv = int(attr(n, "num_heads")), int(attr(n, "kv_num_heads"))
    past_k, past_v = n.inputs[_PAST_K], n.inputs[_PAST_V]
    if past_k is None or past_v is None or past_k.shape is None or not isinstance(past_k.shape[-1], int):
        raise NotApplicable(f"{n.name}: no past key/value of a static head size")
    hd, dtype = int(past_k.shape[-1]), past_k.dtype
    assert dtype is not None, "the step form's cache inputs are typed"
    q, k, v = n.inputs[_Q], n.inputs[_K], n.inputs[_V]
    if k is None or v is None:  # packed QKV
        parts = b.const(f"qkv_{heads}_{kv}_{hd}", np.array([heads * hd, kv * hd, kv * hd], np.int64))
        q, k, v = b.node("Split", [q, parts], outputs=3, axis=-1).outputs
    if q is None:
        raise NotApplicable(f"{n.name}: no query input")
    scale = float(attr(n, "scale", 0.0)) or 1.0 / np.sqrt(hd)
    eps = float(attr(n, "qk_norm_epsilon", 1e-6))
    norms = [n.inputs[i] if len(n.inputs) > i else None for i in (_Q_NORM, _K_NORM)]
    rotary = bool(attr(n, "do_rotary", 0))
    cos_sin = (n.inputs[_COS], n.inputs[_SIN]) if rotary else None
    interleaved = int(attr(n, "rotary_interleaved", 0))
    qh = _heads(b, shared, q, heads, hd, norms[0], eps, scale, cos_sin, interleaved, dtype)
    kh = _heads(b, shared, k, kv, hd, norms[1], eps, 1.0, cos_sin, interleaved, dtype)
    present_k = _write(b, shared, n.outputs[1], past_k, kh, kv, hd, dtype)
    present_v = _write(b, shared, n.outputs[2], past_v, v, kv, hd, dtype)
    rep = heads // kv
    q_t = b.op("Transpose", [b.op("Reshape", [qh, b.const(f"shape_groups_{kv}_{rep}_{hd}",
                                                           np.array([1, kv, rep, hd], np.int64))], dtype)],
               dtype, (1, kv, hd, rep), perm=[0, 1, 3, 2])
    scores_t = b.op("Add", [b.op("MatMul", [present_k, q_t], dtype), shared.bias(dtype)], dtype)
    probs = b.op("Softmax", [b.op("Transpose", [scores_t], dtype, perm=[0, 1, 3, 2])], dtype, axis=-1)
    out = b.op("MatMul", [probs, present_v], dtype, (1, kv, rep, hd))
    flat = b.op("Reshape", [out, b.const("shape_flat", np.array([1, 1, -1], np.int64))], dtype, (1, 1, heads * hd))
    ir.convenience.replace_all_uses_with(n.outputs[0], flat)


def _heads(b: Builder, shared: _Shared, x: ir.Value, heads: int, hd: int, norm: ir.Value | None, eps: float,
           scale: float, cos_sin: tuple | None, interleaved: int, dtype: ir.DataType) -> ir.Value:
    """x [1, 1, heads * hd] with its head norm (weight times `scale`) and rotary embedding, as GroupQueryAttention
    applies them, [1, 1, heads * hd]."""
    if norm is not None:
        if (array := const(norm)) is None:
            raise NotApplicable(f"{norm.name}: a head norm weight that is no constant")
        weight = array * np.asarray(scale, dtype.numpy())
        split = b.op("Reshape", [x, b.const(f"shape_heads_{heads}_{hd}", np.array([1, 1, heads, hd], np.int64))],
                     dtype, (1, 1, heads, hd))
        w = b.const(f"{norm.name}_x{scale:g}", weight.astype(dtype.numpy()))
        normed = b.op("SimplifiedLayerNormalization", [split, w], dtype, (1, 1, heads, hd), axis=-1, epsilon=eps)
        x = b.op("Reshape", [normed, b.const("shape_flat", np.array([1, 1, -1], np.int64))], dtype, (1, 1, heads * hd))
    elif scale != 1.0:
        x = b.op("Mul", [x, b.const(f"scale_{scale:g}_{dtype.name}", np.array(scale, dtype.numpy()))], dtype)
    if cos_sin is None:
        return x
    return b.op("RotaryEmbedding", [x, shared.pos(), *cos_sin], dtype, (1, 1, heads * hd), domain="com.microsoft",
                interleaved=interleaved)


def _write(b: Builder, shared: _Shared, present: ir.Value, past: ir.Value, rows: ir.Value, kv: int, hd: int,
           dtype: ir.DataType) -> ir.Value:
    """The step's rows [1, 1, kv * hd] written at its position into `past` [1, kv, T, hd], as the graph output that
    `present` was (its name and its place among the outputs)."""
    updates = b.op("Reshape", [rows, b.const(f"shape_rows_{kv}_{hd}", np.array([kv, hd], np.int64))], dtype, (kv, hd))
    out = b.op("ScatterND", [past, shared.indices(kv), updates], dtype, past.shape)
    replace(present, out)  # the graph output keeps its name
    return out
