"""How numbers and reasons read in human output (logs, tables, error lines): one convention for every command.

Sizes are 1024-based (MiB, GiB), as the shard limit (25 MiB) and the hosts' caps are written; JSON
reports keep plain bytes. Counts agree with their noun ("1 clip", "4 clips").
"""

from __future__ import annotations

import re

_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def size(n_bytes: int | float) -> str:
    """`n_bytes` in the largest 1024-based unit it fills: "25.0 MiB", "1.20 GiB", "512 B"."""
    for unit, scale in _UNITS:
        if n_bytes >= scale:
            return f"{n_bytes / scale:.2f} {unit}" if unit == "GiB" else f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def plural(n: int, noun: str) -> str:
    """`n` with `noun` in the singular for 1 ("1 clip") and with an s otherwise ("0 clips", "4 clips")."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def one_line(text: str) -> str:
    """`text` with its line breaks (a browser's stack trace, a multi-line message) folded into spaces:
    a reason in a table row, a log line or an XML attribute stays one line."""
    return re.sub(r"\s*\n\s*", " ", text.strip())
