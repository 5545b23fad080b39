"""Every module path the docs and the code's comments name exists: a path under the repository's folders
(`webbuild/pipeline/stages.py`, `scripts/gpu_bench.sh`), one relative to a package (`runtime/site.js`,
`pipeline/wasm_budget.py`, a test helper `fusion/partial.py`), and a dotted module name (`webbuild.pipeline.check`,
with at most one name defined in it after). A file that is gone is named with the commit that has it,
`REV:PATH` (`git show REV:PATH` gives it back), or run "in a checkout of REV" (said on its line,
or in the code block, or just above it): history stays readable, and a rename cannot leave a reference behind."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUFFIXES = r"(?:py|js|mjs|sh|md|html|j2|json|yaml|toml|txt)"
# not preceded by a path character or a `REV:` (history: the file at that commit)
FREE = r"(?<![\w./:-])"
ROOTED = re.compile(FREE + rf"((?:webbuild|scripts|tests|docs|examples)/[\w/.-]*\.{SUFFIXES})\b")
PACKAGES = "runtime|app|pipeline|forms|fusion|quantize|graph|site|reference|tools|zoo|train|bench|verify"
RELATIVE = re.compile(FREE + rf"((?:{PACKAGES})/[\w/.-]*\.(?:py|js|mjs))\b")
DOTTED = re.compile(FREE + r"(webbuild(?:\.[a-z_]\w*)+)")
BASES = [REPO / "webbuild", REPO / "webbuild" / "template", REPO / "webbuild" / "tools", REPO / "tests"]
AT_COMMIT = re.compile(r"checkout of [0-9a-f]{7,40}\b")


def sources() -> list[Path]:
    """The docs, and the code whose comments and docstrings name modules."""
    docs = [*REPO.glob("*.md"), *(REPO / "docs").glob("*.md"), REPO / "scripts" / "README.md",
            *(REPO / "examples").rglob("*.md")]
    code = [f for f in (REPO / "webbuild").rglob("*") if f.suffix in (".py", ".js", ".mjs", ".j2")
            and "onnxruntime-web" not in f.parts and "__pycache__" not in f.parts]
    return docs + code + [f for f in (REPO / "scripts").iterdir() if f.suffix in (".py", ".sh", ".mjs")]


def defines(module: Path, name: str) -> bool:
    pattern = rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^{name}\s*[:=]|^\s*(?:from\s.*\s)?import\s.*\b{name}\b"
    return re.search(pattern, module.read_text(), re.M) is not None


def module_exists(dotted: str) -> bool:
    """webbuild.a.b[.name]: the packages and the module exist, and the name after them is defined there. A
    dotted name whose first part is no module of webbuild (a metadata key such as webbuild.accuracy_level)
    is not a module path and passes."""
    parts = dotted.split(".")
    path = REPO / "webbuild"
    if not ((path / parts[1]).is_dir() or (path / f"{parts[1]}.py").is_file()):
        return True
    for i, part in enumerate(parts[1:], 1):
        if (path / part / "__init__.py").is_file():
            path = path / part
        elif (path / f"{part}.py").is_file():
            return i + 1 == len(parts) or (i + 2 == len(parts) and defines(path / f"{part}.py", parts[i + 1]))
        else:
            return i + 1 == len(parts) and defines(path / "__init__.py", part)
    return True


def missing(line: str) -> list[str]:
    out = [p for p in ROOTED.findall(line) if not (REPO / p).exists()]
    out += [p for p in RELATIVE.findall(line) if not any((base / p).exists() for base in BASES)]
    return out + [d for d in DOTTED.findall(line) if not module_exists(d)]


def historical(lines: list[str]) -> set[int]:
    """Indexes of the lines that run at a commit: those saying "checkout of REV", and the whole of a fenced code
    block that says it, or whose three lines above do."""
    out = {i for i, line in enumerate(lines) if AT_COMMIT.search(line)}
    fences = [i for i, line in enumerate(lines) if line.lstrip().startswith("```")]
    for start, end in zip(fences[::2], fences[1::2]):
        if any(AT_COMMIT.search(line) for line in lines[max(0, start - 3):end]):
            out |= set(range(start, end))
    return out


def test_every_module_path_named_exists():
    bad = []
    for f in sources():
        lines = f.read_text().splitlines()
        old = historical(lines)
        bad += [f"{f.relative_to(REPO)}:{i + 1}: {p}" for i, line in enumerate(lines) if i not in old
                for p in missing(line)]
    assert not bad, "named but not there (a file that is gone: REV:path):\n" + "\n".join(bad)


def test_the_rules_catch_what_they_should():
    assert missing("see `webbuild/pipeline/nope.py` and runtime/nope.js") == ["webbuild/pipeline/nope.py",
                                                                           "runtime/nope.js"]
    assert missing("`webbuild.pipeline.nope`, webbuild.pipeline.check.no_such_name") == [
        "webbuild.pipeline.nope", "webbuild.pipeline.check.no_such_name"]
    assert missing("`webbuild.pipeline.stages`, runtime/site.js, fusion/partial.py, f7a0ad4:webbuild/gone.py, "
                   "the metadata key webbuild.accuracy_level") == []
    lines = ["# in a checkout of f7a0ad4:", "```sh", "python webbuild/gone.py", "```", "webbuild/gone.py"]
    assert historical(lines) == {0, 1, 2}
