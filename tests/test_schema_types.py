"""The TypeScript types of manifest.json and runtime.json (webbuild/site/schemas/*.d.ts, what `tsc --checkJs`
checks the runtime against) are generated from their JSON schemas and checked in: never stale."""

from __future__ import annotations

from webbuild.site.schema_types import declarations, generated


def test_checked_in_declarations_are_current():
    stale = [path.name for path, text in generated().items() if not path.is_file() or path.read_text() != text]
    assert not stale, f"regenerate with `python -m webbuild.site.schema_types`: {stale}"


def test_declarations_of_each_schema_construct():
    schema = {"title": "a thing", "type": "object", "required": ["id"], "additionalProperties": False,
              "properties": {"id": {"const": 1}, "kind": {"enum": ["a", "b"]}, "parts": {"type": "array",
                             "items": {"$ref": "#/$defs/part"}}, "by_name": {"type": "object",
                             "additionalProperties": {"type": "integer"}}},
              "$defs": {"part": {"type": "string", "description": "a part"}}}
    assert declarations(schema, "Thing").splitlines()[2:] == [
        "/** a part */", "export type Part = string;", "",
        "/** a thing */", "export type Thing = {", "  id: 1;", '  kind?: "a" | "b";', "  parts?: Part[];",
        "  by_name?: {", "    [k: string]: number;", "  };", "};"]
