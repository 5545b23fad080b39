"""docs/model-yaml.md, rendered from the model.yaml schema (webbuild.config.BuildConfig) so that the
reference cannot drift from what the build accepts; tests/test_config_reference.py keeps them equal.

    python -m webbuild.config_reference > docs/model-yaml.md
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from webbuild.config import BuildConfig

COMMAND = "python -m webbuild.config_reference > docs/model-yaml.md"
WIDTH = 100
LIST_MARKER = re.compile(r"[-+*]|\d+[.)]")
SCALARS = {str: "string", bool: "boolean", int: "integer", float: "number", Path: "path"}
# annotated_types / pydantic metadata attribute -> how the constraint reads
CONSTRAINTS = {"ge": ">= {}", "gt": "> {}", "le": "<= {}", "lt": "< {}", "min_length": "length >= {}",
               "max_length": "length <= {}", "pattern": "matches `{}`"}
HEADER = f"""# model.yaml reference

<!-- Generated from webbuild/config.py by `{COMMAND}`;
tests/test_config_reference.py keeps the two equal. Edit the schema's descriptions, not this file. -->

A minimal model.yaml:

```yaml
name: tiny-asr
source: {{layout: qwen3-asr-split, dir: ./model}}   # dir relative to this file
```

Paths are relative to the model.yaml file. Unknown keys, wrong types, bad values and missing files
each get one line naming the key, and exit code 2:
`model.yaml: source.layout: expected one of 'qwen3-asr-split', 'merged', 'qwen3-asr-v2'; got 'splt'`.

Every key, as `key` (type; default; allowed values): description.

"""


def render_reference() -> str:
    """The Markdown page: every key of model.yaml with its type, default, allowed values and description."""
    return HEADER + "".join(_entry(*row) for row in field_rows(BuildConfig))


def _entry(key: str, kind: str, default: str, allowed: str, description: str) -> str:
    """One list item, wrapped at WIDTH."""
    details = "; ".join(filter(None, [kind, default if default in ("", "required") else f"default {default}",
                                      allowed and f"allowed: {allowed}"]))
    return _wrap(f"- `{key}` ({details}): {description}") + "\n"


def _wrap(text: str) -> str:
    """Lines of at most WIDTH, continued with two spaces; a word that would open a list at the start of
    a line ('+', '-', '1.') stays on the line before."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > WIDTH and not LIST_MARKER.fullmatch(word):
            lines.append(line)
            line = f"  {word}"
        else:
            line = f"{line} {word}" if line else word
    return "\n".join([*lines, line])


def field_rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, ...]]:
    """(key, type, default, allowed, description) per field, nested sections after their own row."""
    for name, field in model.model_fields.items():
        if field.exclude:  # set by the loader, not by model.yaml
            continue
        key = f"{prefix}{name}"
        kind, allowed, nested = describe_type(field.annotation)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        kind = str(extra.get("kind", kind))  # a key a validator also takes in another form
        listed = extra.get("allowed")  # values a validator checks
        allowed = [_code(value) for value in listed] if isinstance(listed, list) and listed else allowed
        allowed += [text.format(value) for meta in field.metadata for attr, text in CONSTRAINTS.items()
                    if (value := getattr(meta, attr, None)) is not None]
        yield key, kind, _default(field, nested), ", ".join(allowed), field.description or ""
        if nested is not None:
            yield from field_rows(nested, f"{key}[]." if kind.startswith("list") else f"{key}.")


def describe_type(annotation) -> tuple[str, list[str], type[BaseModel] | None]:
    """(type name, allowed values, the section model for mappings) of a field's annotation."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return SCALARS[type(args[0])], [_code(a) for a in args], None
    if origin is list:
        kind, allowed, nested = describe_type(args[0])
        return f"list of {kind}s", allowed, nested
    if origin in (Union, types.UnionType):
        kinds = [describe_type(a) for a in args if a is not type(None)]
        return " or ".join(k for k, _, _ in kinds) + " or null", [], None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "mapping", [], annotation
    return SCALARS[annotation], [], None


def _default(field: FieldInfo, nested: type[BaseModel] | None) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if nested is not None and isinstance(value, BaseModel):
        return ""  # a section: its keys carry the defaults
    return _code(value)


def _code(value) -> str:
    """`value` as it is written in model.yaml."""
    text = yaml.safe_dump(str(value) if isinstance(value, Path) else value, default_flow_style=True)
    return f"`{text.removesuffix(chr(10)).removesuffix('...').strip()}`"


if __name__ == "__main__":
    print(render_reference(), end="")
