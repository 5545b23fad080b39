"""What the rules did: counts of fusions and, for every pattern left alone, where and why."""

from __future__ import annotations

from dataclasses import dataclass, field

from webbuild.text import plural


@dataclass
class Report:
    fused: dict[str, int] = field(default_factory=dict)
    missed: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def hit(self, rule: str, n: int = 1) -> None:
        self.fused[rule] = self.fused.get(rule, 0) + n

    def miss(self, rule: str, where: str, why: str) -> None:
        self.missed.append({"rule": rule, "at": where, "why": why})

    def as_dict(self) -> dict:
        return {"fused": dict(self.fused), "not_fused": list(self.missed), "notes": list(self.notes)}


# What --strict (fusion.strict) fails on: a miss of an attention, norm or quantized-weight rule, and the
# standard-domain ops an attention, a norm or a quantized MatMul left unfused still holds (a spelling no rule
# recognised records no miss; opset 23's Attention, RMSNormalization and RotaryEmbedding are not what
# onnxruntime-web's WebGPU EP runs fused).
STRICT_RULES = {"gqa": "attention", "encoder_attention": "attention", "rms_norm": "norm",
                "skip_rms_norm": "norm", "layer_norm": "norm", "skip_layer_norm": "norm", "rms_normalization": "norm",
                "matmul_nbits": "quantized MatMul"}
LEFT_OVER = {"Softmax": "attention", "Attention": "attention", "RotaryEmbedding": "attention",
             "ReduceMean": "norm", "RMSNormalization": "norm", "DequantizeLinear": "quantized MatMul",
             "MatMulInteger": "quantized MatMul"}
SHOWN = 3  # places listed per rule and reason by default; the JSON reports have them all


def left_over(nodes) -> list[dict]:
    """{"op", "at"} for every standard-domain node of LEFT_OVER's ops among `nodes` (a graph's); a
    DequantizeLinear only where it feeds a MatMul or Gemm (a lookup table's is no MatMul)."""
    return [{"op": n.op_type, "at": n.name or n.op_type} for n in nodes
            if n.op_type in LEFT_OVER and n.domain in ("", "ai.onnx")
            and (n.op_type != "DequantizeLinear" or _feeds_matmul(n.outputs[0]))]


def _feeds_matmul(v, hops: int = 3) -> bool:
    """Does `v` reach a MatMul or Gemm through at most `hops` Reshape / Transpose / Cast nodes?"""
    for user in v.consumers():
        if user.op_type in ("MatMul", "Gemm"):
            return True
        if hops and user.op_type in ("Reshape", "Transpose", "Cast") and _feeds_matmul(user.outputs[0], hops - 1):
            return True
    return False


def summary(graphs: dict[str, dict], shown: int | None = SHOWN) -> list[str]:
    """The one account of what fusion left alone, over graphs {name: {"not_fused": misses, "left_over":
    left_over(...) (else "ops": census after)}}: per graph, rule and reason, how many and where (the first
    `shown` places; None: all); then the attention, norm and quantized-weight ops left, and where. Empty when
    every pattern fused."""
    lines = []
    for graph, rep in graphs.items():
        groups: dict[tuple[str, str], list[str]] = {}
        for miss in rep["not_fused"]:
            groups.setdefault((miss["rule"], miss["why"]), []).append(miss["at"])
        for (rule, why), places in groups.items():
            lines += [f"  {graph}: {rule} x{len(places)}: {why}", _places(places, shown)]
        for op, places in _left(rep).items():
            lines.append(f"  {graph}: {len(places)} {op} left ({LEFT_OVER[op]} not fused)")
            lines += [_places(places, shown)] if places and places[0] else []
    return ["not fused:", *lines] if lines else []


def _places(places: list[str], shown: int | None) -> str:
    cut = len(places) if shown is None else shown
    more = f" (+{len(places) - cut} more in the JSON report)" if len(places) > cut else ""
    return f"    at {', '.join(places[:cut])}{more}"


def _left(rep: dict) -> dict[str, list[str]]:
    """op -> where, of the LEFT_OVER ops a graph report holds (its places unknown when it has only a census)."""
    if "left_over" in rep:
        out: dict[str, list[str]] = {}
        for item in rep["left_over"]:
            out.setdefault(item["op"], []).append(item["at"])
        return out
    return {op: [""] * n for op, n in rep["ops"].items() if op in LEFT_OVER}


def strict_failures(graphs: dict[str, dict]) -> list[str]:
    """The attention, norms and quantized MatMuls `summary`'s graphs left unfused, one line per graph and
    kind; empty when none (what --strict and fusion.strict turn into exit code 1)."""
    out = []
    for graph, rep in graphs.items():
        counts: dict[str, int] = {}
        for miss in rep["not_fused"]:
            kind = STRICT_RULES.get(miss["rule"])
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
        for op, places in _left(rep).items():
            counts[LEFT_OVER[op]] = max(counts.get(LEFT_OVER[op], 0), len(places))
        out += [f"{graph}: {plural(n, kind + ' pattern')} not fused" for kind, n in counts.items()]
    return out
