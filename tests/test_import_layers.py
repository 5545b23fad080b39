"""The house plan, enforced: packages import one way down the layers of docs/architecture.md, no
import cycle of any length between modules, no private name imported across packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "webbuild"
# top to bottom: a package imports only from the layers below its own, never from a peer
LAYERS = [
    {"cli", "config_reference"},
    {"tools", "train"},
    {"pipeline", "zoo"},
    {"forms"},
    {"reference"},
    {"fusion", "quantize"},
    {"site", "graph", "config"},
    {"errors", "text", "adapters", "layouts"},
]


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in ROOT.rglob("*.py")}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(module, imported names) of every import in `path`, function-level ones included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


def _edges() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        for target, names in _imports(path):
            if not target.startswith("webbuild"):
                continue
            # `from webbuild.fusion import gqa` imports the module webbuild.fusion.gqa
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in mods]
            edges[mod] |= set(subs) or {target}
    return edges


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _layer(package: str) -> int:
    for i, layer in enumerate(LAYERS):
        if package in layer:
            return i
    raise AssertionError(f"package webbuild.{package} is in no layer of tests/test_import_layers.py")


def test_every_package_has_a_layer():
    for mod in _modules():
        if _package(mod) not in ("", "__main__"):
            _layer(_package(mod))


def test_imports_go_down_the_layers():
    wrong = []
    for mod, targets in _edges().items():
        src = _package(mod)
        if src in ("", "__main__"):
            continue
        for target in targets:
            dst = _package(target)
            if dst and dst != src and _layer(dst) <= _layer(src):
                wrong.append(f"{mod} -> {target}")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_cycle():
    edges = _edges()
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(t):] + [t]))
            if t in edges and not state.get(t):
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m)


def test_no_private_names_across_packages():
    wrong = []
    for mod, path in _modules().items():
        for target, names in _imports(path):
            if target.startswith("webbuild") and _package(target) != _package(mod):
                hidden = [n for n in names if n.startswith("_")] + [p for p in target.split(".") if p.startswith("_")]
                wrong += [f"{mod}: {target}.{n}" for n in hidden]
    assert not wrong, "private names imported across packages:\n" + "\n".join(wrong)


def test_only_training_imports_scipy():
    """scipy is in the train extra only: `webbuild verify` (the verify extra: Playwright) once crashed with
    "No module named 'scipy'" from the live check's WAV writer. Every other module reads and writes WAV with
    webbuild.reference's own code."""
    wrong = [f"{mod} imports {target}" for mod, path in _modules().items() if _package(mod) != "train"
             for target, _ in _imports(path) if target.split(".")[0] == "scipy"]
    assert not wrong, wrong
