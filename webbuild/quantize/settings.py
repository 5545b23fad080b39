"""Quantization settings: the `quantize:` block of model.yaml as a plain value."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class QuantSettings:
    method: str = "rtn"  # rtn | hqq | none
    bits: int = 4
    block_size: int = 32
    accuracy_level: int = 4
    exclude: tuple[str, ...] = field(default_factory=tuple)  # fnmatch patterns on MatMul node names

    def __post_init__(self):
        if self.method not in ("rtn", "hqq", "none"):
            raise ValueError(f"quantize.method {self.method!r}: expected rtn, hqq or none")
        if self.bits not in (4, 8):
            raise ValueError(f"quantize.bits {self.bits}: expected 4 or 8")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"quantize.block_size {self.block_size}: expected a power of two >= 16")

    @classmethod
    def from_config(cls, q) -> QuantSettings:
        """From webbuild.config.Quantize (or anything with the same attributes)."""
        return cls(q.method, q.bits, q.block_size, q.accuracy_level, tuple(q.exclude))
