"""Blockwise-dequantized constant weights, recognised in the spellings exporters and onnxruntime's WebNN
EP write, and re-packed for MatMulNBits and GatherBlockQuantized from the bytes the graph stores.

Spellings (q an int4 / uint4 / int8 / uint8 constant; float scales and integer zero points constant):
- `DequantizeLinear(q, scale[, zero_point], axis, block_size)` on a 2-D q (the opset-21 spelling);
- the same on a 3-D q [R, blocks, block] (or [blocks, block, C]) with one block along its last (middle)
  axis, then `Reshape` to 2-D (the WebNN EP's lowering of MatMulNBits);
- `Cast(q) [-> Sub(zero point)] -> Mul(scale)` on such a 3-D q, scales [R, blocks, 1] (or [blocks, 1, C]),
  then `Reshape` (the WebNN EP's spelling where DequantizeLinear takes no 4-bit input).
`dequantized(v)` reads any of them as a `Blocked` 2-D matrix of codes blocked along one axis; a rule takes
it through an optional Transpose and float Cast (`operand`). `pack` turns it into the unsigned uint8 layout of
webbuild.graph.packing. A matrix blocked along its last axis (a [V, H] embedding table, an lm_head tied to
it, the WebNN EP's [N, K] weights) is that layout byte for byte: its stored bytes are used as they are
(memory-mapped; signed codes get their top bits flipped), never unpacked nor dequantized. Only a weight
blocked along its first axis ([K, N], axis 0) is unpacked to be transposed, one code a byte. One pack per
stored q and orientation (`_PACKED` on the graph), so a tied table and lm_head share one initializer.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import onnx_ir as ir

from webbuild.fusion.rule import Miss
from webbuild.graph.ir import attr, const, new_const, prod
from webbuild.graph.packing import n_blocks, pack_codes, unsigned_bytes

ACCURACY_KEY = "webbuild.accuracy_level"  # carried by decompose so a round trip keeps it
# graph.meta keys; the dicts hold their keys, so a key is never a freed object's reused id
_PACKED = "webbuild.packed"  # (q value, axis) -> Packed
_SCALES = "webbuild.matmul_scales"  # Packed -> its scales initializer
_BITS = {ir.DataType.INT4: (4, True), ir.DataType.UINT4: (4, False),
         ir.DataType.INT8: (8, True), ir.DataType.UINT8: (8, False)}
_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16}
REBLOCK = 32  # the block a per-column or per-row weight is cut into (the build's own block size)


@dataclass(frozen=True)
class Blocked:
    """A dequantized matrix [rows, cols] of stored codes `q`, blocked along `axis` (0 or 1)."""
    q: ir.Value
    scale: np.ndarray  # [rows, n_blocks] (axis 1) or [n_blocks, cols] (axis 0)
    zero: np.ndarray | None  # like scale, as stored (signed for int4/int8); None: DequantizeLinear's 0
    rows: int
    cols: int
    axis: int
    block_size: int
    bits: int
    signed: bool
    core: ir.Node  # the DequantizeLinear, or the Cast of the Cast/Sub/Mul spelling
    nodes: tuple[ir.Node, ...]  # every node from q to the 2-D value


@dataclass(frozen=True, eq=False)  # hashed by identity: a key of _SCALES
class Packed:
    """A Blocked matrix in MatMulNBits' layout, rows = the unblocked axis."""
    data: ir.Value  # uint8 [rows, n_blocks, blob]
    scale: np.ndarray  # [rows, n_blocks]
    zero: np.ndarray | None  # unsigned [rows, n_blocks]; None: all at the unsigned default 2^(bits-1)
    rows: int
    k: int
    block_size: int
    bits: int


def has_dequantized(model: ir.Model) -> bool:
    """Does the graph hold a DequantizeLinear or a Cast of an integer constant (rules to run)?"""
    return any(n.op_type == "DequantizeLinear" or (n.op_type == "Cast" and _int_const(n.inputs[0]) is not None)
               for n in model.graph)


@dataclass(frozen=True)
class Operand:
    """A rule's operand that is a Blocked matrix, under optional float Casts and a 2-D Transpose."""
    blocked: Blocked
    transposed: bool

    @property
    def where(self) -> str:
        """The dequantization's node, for the rule's misses."""
        return self.blocked.core.name or self.blocked.core.op_type


def operand(v: ir.Value | None) -> Operand | Miss | None:
    """`v` as an Operand; a Miss saying why the dequantized constant under it cannot be packed; None
    when there is none."""
    under, transposed = through(v)
    b = dequantized(under)
    if isinstance(b, str):
        return Miss(b)
    return None if b is None else Operand(b, transposed)


def through(v: ir.Value | None) -> tuple[ir.Value | None, bool]:
    """(the value under optional float Casts and an optional 2-D Transpose, whether it was transposed)."""
    transposed = False
    for _ in range(3):
        n = prod(v)
        if n is None or (n.op_type == "Cast" and attr(n, "to") not in _FLOATS):
            break
        if n.op_type == "Transpose" and not transposed and list(attr(n, "perm", [1, 0])) == [1, 0]:
            transposed = True
        elif n.op_type != "Cast":
            break
        v = n.inputs[0]
    return v, transposed


def dequantized(v: ir.Value | None) -> Blocked | str | None:
    """`v` as a Blocked matrix; a string saying why it cannot be packed; None when `v` is not a
    dequantized constant at all."""
    reshape = prod(v, "Reshape")
    inner = reshape.inputs[0] if reshape is not None else v
    found = _core(inner)
    if found is None or isinstance(found, str):
        return found
    q, scale, zero, axis, block, core, nodes = found
    t = _int_const(q)
    assert t is not None, "_core returns integer constant codes"
    shape = [int(d) for d in t.shape.numpy()]
    if reshape is not None:
        nodes = (*nodes, reshape)
        target = const(reshape.inputs[1])
        if len(shape) != 3 or target is None:
            return "a Reshape of a dequantized weight that is not 3-D, or to a computed shape"
        which = _merged(shape, scale.shape, [int(x) for x in target.reshape(-1)])
        if which is None:
            return f"dequantized {shape} blocks do not merge into the Reshape target {target.tolist()}"
        if axis is not None and axis != which:
            return f"DequantizeLinear blocked along axis {axis}, not within the {shape} blocks"
        block = shape[which]
        if which == 2:  # [R, blocks, block] -> [R, K], blocked along axis 1
            rows, cols, axis = shape[0], shape[1] * block, 1
            scale, zero = (None if a is None else a.reshape(shape[0], shape[1]) for a in (scale, zero))
        else:  # [blocks, block, C] -> [K, C], blocked along axis 0
            rows, cols, axis = shape[0] * block, shape[2], 0
            scale, zero = (None if a is None else a.reshape(shape[0], shape[2]) for a in (scale, zero))
    elif len(shape) != 2 or axis is None:
        return f"a {len(shape)}-D dequantized weight without a Reshape to 2-D"
    else:
        rows, cols = shape
    bits, signed = _BITS[t.dtype]
    if zero is not None and zero.shape != scale.shape:
        zero = _zero_like(zero, scale, t.dtype)
        if isinstance(zero, str):
            return zero
    return reblocked(Blocked(q, scale, zero, rows, cols, axis, block, bits, signed, core, tuple(nodes)))


def reblocked(b: Blocked) -> Blocked:
    """`b` with blocks MatMulNBits takes (powers of 2 >= 16), each scale repeated over the smaller blocks:
    a block that is a multiple of one (48 = 3 x 16), or a single block along the axis (per-column or per-row
    scales; the last block padded)."""
    length = b.rows if b.axis == 0 else b.cols
    whole = b.block_size >= length
    # one block: REBLOCK (smaller for a short axis); else the largest power of 2 dividing the block
    new = min(REBLOCK, 1 << max(4, (length - 1).bit_length())) if whole else b.block_size & -b.block_size
    if new == b.block_size or new < 16:
        return b
    reps = -(-b.block_size // new) if whole else b.block_size // new
    keep = n_blocks(length, new)

    def spread(a: np.ndarray) -> np.ndarray:
        return np.repeat(a, reps, axis=b.axis).take(range(keep), axis=b.axis)

    return replace(b, scale=spread(b.scale), zero=None if b.zero is None else spread(b.zero), block_size=new)


def _core(v: ir.Value | None):
    """(q value, scale, zero, blocked axis or None (3-D Cast spelling), block size, core node, nodes),
    a reason string, or None."""
    n = prod(v, "DequantizeLinear", "Mul")
    if n is None:
        return None
    if n.op_type == "DequantizeLinear":
        return _dequantize_linear(n)
    for x, s in ((n.inputs[0], n.inputs[1]), (n.inputs[1], n.inputs[0])):
        found = _cast_sub(x)
        scale = const(s) if found is not None else None  # read only once the other side is integer codes
        if found is None or scale is None:
            continue
        if isinstance(found, str):
            return found
        q, zero, nodes = found
        t = _int_const(q)
        assert t is not None, "_cast_sub reaches integer constant codes"
        shape = tuple(int(d) for d in t.shape.numpy())
        if len(shape) == 2 and scale.ndim <= 2:  # per-column or per-row scales on a 2-D weight: one block
            return _one_block(q, shape, scale, zero, nodes[0], (*nodes, n))
        if len(shape) != 3 or scale.ndim != 3:
            return "Cast/Sub/Mul dequantization of a weight that is not 3-D [rows, blocks, block]"
        zero_points = _zero_like(zero, scale, t.dtype)
        if isinstance(zero_points, str):
            return zero_points
        return q, scale, zero_points, None, 0, nodes[0], (*nodes, n)
    return None


def _dequantize_linear(n: ir.Node):
    """_core's reading of a DequantizeLinear: blockwise, or per-axis on a 2-D weight (one block)."""
    q = n.inputs[0]
    t = _int_const(q)
    if t is None or q is None:
        return None
    scale, block = const(n.inputs[1]), attr(n, "block_size", 0)
    zero = const(n.inputs[2]) if len(n.inputs) > 2 and n.inputs[2] is not None else None
    if len(n.inputs) > 2 and n.inputs[2] is not None and zero is None:
        return "computed zero points"
    shape = tuple(int(d) for d in t.shape.numpy())
    axis = attr(n, "axis", 1) % len(shape)
    if scale is not None and not block and len(shape) == 2 and scale.ndim == 1 and scale.size == shape[axis]:
        # per-axis: one scale per row (axis 0) or column (axis 1), i.e. one block along the other axis
        per = (lambda a: a.reshape(-1, 1)) if axis == 0 else (lambda a: a.reshape(1, -1))
        return _one_block(q, shape, per(scale), None if zero is None else per(zero), n, (n,))
    if scale is None or scale.ndim != len(shape) or not block:
        return "DequantizeLinear is not blockwise (per-tensor scales)"
    if len(shape) == 3 and scale.shape[axis] != 1:
        return "a 3-D DequantizeLinear with more than one block along its blocked axis"
    return q, scale, zero, axis, block, n, (n,)


def _cast_sub(x: ir.Value | None) -> tuple[ir.Value, np.ndarray | None, tuple[ir.Node, ...]] | str | None:
    """x = Cast(q) [- z], or Cast(Cast(q) - z) (the Sub before the float Cast, on a wider integer type):
    (q, z as stored or None, the nodes from q up, first the Cast of q); a reason; None when x is not
    integer codes."""
    nodes: list[ir.Node] = []
    zero_v: ir.Value | None = None
    for _ in range(4):
        n = prod(x, "Cast", "Sub")
        if n is None:
            break
        if n.op_type == "Sub":
            if zero_v is not None:
                return None
            zero_v = n.inputs[1]
        nodes.insert(0, n)
        x = n.inputs[0]
        if n.op_type == "Cast" and _int_const(x) is not None:
            break
    if not nodes or nodes[0].op_type != "Cast" or _int_const(x) is None or x is None:
        return None
    zero = const(zero_v) if zero_v is not None else None
    if zero_v is not None and (zero is None or not np.array_equal(zero, np.round(zero))):
        return "the Sub's zero points are not constant integers"
    return x, zero, tuple(nodes)


def _zero_like(zero: np.ndarray | None, scale: np.ndarray, dtype: ir.DataType) -> np.ndarray | None | str:
    """Zero points as int64 shaped like the scales (a scalar or per-row/column one broadcast), checked
    within the codes' range; None when absent."""
    if zero is None:
        return None
    try:
        z = np.broadcast_to(zero.reshape(zero.shape[-scale.ndim:] if zero.ndim > scale.ndim else zero.shape),
                            scale.shape).astype(np.int64)
    except ValueError:
        return f"zero points of shape {list(zero.shape)} for scales of shape {list(scale.shape)}"
    bits, signed = _BITS[dtype]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2 ** bits - 1)
    if z.min() < lo or z.max() > hi:
        return f"zero points outside the {bits}-bit codes' range"
    return z


def _one_block(q: ir.Value, shape: tuple[int, ...], scale: np.ndarray, zero: np.ndarray | None, core: ir.Node,
               nodes: tuple[ir.Node, ...]):
    """A 2-D weight with one scale per column ([1, C]: one block along axis 0) or per row ([R, 1]: along
    axis 1), as _core returns it; the caller re-blocks it (`reblocked`)."""
    t = _int_const(q)
    assert t is not None, "called on integer constant codes"
    scale = scale.reshape(1, -1) if scale.ndim == 1 else scale
    if scale.shape == (1, shape[1]):
        axis = 0
    elif scale.shape == (shape[0], 1):
        axis = 1
    else:
        return f"scales of shape {list(scale.shape)} for a {list(shape)} weight (not per column, row or block)"
    z = _zero_like(zero, scale, t.dtype)
    if isinstance(z, str):
        return z
    return q, scale, z, axis, shape[axis], core, nodes


def _int_const(v: ir.Value | None) -> ir.TensorProtocol | None:
    t = ir.convenience.get_const_tensor(v) if v is not None else None
    return t if t is not None and t.dtype in _BITS else None


def _merged(shape: list[int], scale: tuple, target: list[int]) -> int | None:
    """The axis (2: [R, blocks, block]; 1: [blocks, block, C]) whose blocks the Reshape to `target`
    merges: the scales are 1 along it and the target is the 2-D product."""
    for which, want in ((2, [shape[0], shape[1] * shape[2]]), (1, [shape[0] * shape[1], shape[2]])):
        if (tuple(scale) == tuple(1 if i == which else d for i, d in enumerate(shape))
                and len(target) == 2 and _resolve(target, shape) == want and shape[which] > 1):
            return which
    return None


def _resolve(target: list[int], shape: list[int]) -> list[int] | None:
    """Reshape's target with 0 (copy) and -1 (infer) resolved."""
    out = [shape[i] if d == 0 else d for i, d in enumerate(target)]
    if out.count(-1) == 1:
        known = int(np.prod([d for d in out if d != -1]))
        out[out.index(-1)] = int(np.prod(shape)) // known if known else -1
    return out


def unfit(b: Blocked, packable: str) -> str | None:
    """Why `b` cannot become the contrib op (`packable` names it), or None."""
    if b.block_size < 16 or b.block_size & (b.block_size - 1):
        return f"block size {b.block_size} ({packable} takes powers of 2 >= 16)"
    if b.scale.dtype not in (np.float32, np.float16):
        return f"{b.scale.dtype} scales"
    return None


def pack(g: ir.Graph, b: Blocked) -> Packed:
    """`b` with rows = its unblocked axis, in MatMulNBits' layout; packed once per stored q and axis."""
    cache = g.meta.setdefault(_PACKED, {})
    key = (b.q, b.axis)
    if key not in cache:
        cache[key] = _pack(g, b)
    return cache[key]


def _pack(g: ir.Graph, b: Blocked) -> Packed:
    t = ir.convenience.get_const_tensor(b.q)
    assert t is not None, "a Blocked's codes are a constant (dequantized)"
    rows, k = (b.rows, b.cols) if b.axis == 1 else (b.cols, b.rows)
    blocks, shift = n_blocks(k, b.block_size), 2 ** (b.bits - 1) if b.signed else 0
    blob = b.block_size * b.bits // 8
    if b.axis == 1 and k % b.block_size == 0:  # already MatMulNBits' layout: the stored bytes as they are
        data = unsigned_bytes(t, b.bits, b.signed).reshape(rows, blocks, blob)
    else:  # blocked along the first axis: one code a byte, transposed, padded to whole blocks
        codes = np.zeros((rows, blocks * b.block_size), np.uint8)
        q = t.numpy().reshape(b.rows, b.cols)
        codes[:, :k] = (q if b.axis == 1 else q.T).astype(np.int16) + shift
        data = pack_codes(codes, b.bits).reshape(rows, blocks, blob)
    orient = (lambda a: a) if b.axis == 1 else (lambda a: a.T)
    scale = np.ascontiguousarray(orient(b.scale))
    zero = None if b.zero is None else np.ascontiguousarray(orient(b.zero)).astype(np.int16) + shift
    if zero is None and not b.signed:
        zero = np.zeros((rows, blocks), np.int16)  # DequantizeLinear's default 0, not MatMulNBits' 2^(bits-1)
    if zero is not None and np.all(zero == 2 ** (b.bits - 1)):
        zero = None
    base = b.q.name or "weight"
    return Packed(new_const(g, f"{base}.B", data), scale, None if zero is None else zero.astype(np.uint8),
                  rows, k, b.block_size, b.bits)


def matmul_scales(g: ir.Graph, p: Packed) -> ir.Value:
    """MatMulNBits' scales [rows, n_blocks] (as onnxruntime's quantizer writes them), one initializer per
    Packed (a tied lookup reshapes it)."""
    cache = g.meta.setdefault(_SCALES, {})
    if p not in cache:
        cache[p] = new_const(g, f"{p.data.name}.scales", p.scale)
    return cache[p]


def matmul_zero_points(p: Packed) -> np.ndarray:
    """MatMulNBits' zero points: [rows * ceil(n_blocks * bits / 8)], packed like B along the blocks."""
    assert p.zero is not None, "called for a Packed with zero points"
    return pack_codes(p.zero, p.bits).reshape(-1)


def shared(b: Blocked) -> bool:
    """Is the stored q also dequantized for another consumer (a table tied to lm_head)?"""
    return len(list(b.q.uses())) > 1 or any(len(list(n.outputs[0].uses())) > 1 for n in b.nodes)


def accuracy_level(b: Blocked) -> int:
    return int(b.core.metadata_props.get(ACCURACY_KEY, 0))
