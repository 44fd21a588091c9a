"""StructuredSpec -> llguidance grammar text (pure; compiling it is dsi.structured.compiler's job).

JSON is spelled the way the V4 renderer spells JSON (Python's ``json.dumps`` defaults): ``", "``
between items, ``": "`` after keys, no other whitespace. One fixed spelling keeps the model on
the format it was trained on and cannot loop on whitespace.
"""

from __future__ import annotations

from typing import Any

from dsi.structured.spec import SpecError, StructuredSpec
from dsi.structured.toolcall import toolcall_lark

JSON_OPTIONS: dict[str, Any] = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def grammar_text(spec: StructuredSpec) -> str:
    """The llguidance grammar (serialized JSON form) for ``spec``; raises SpecError."""
    import llguidance

    spec.check()
    match spec.kind:
        case "json_object":
            return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
        case "json_schema":
            schema = spec.schema_obj()
            if isinstance(schema, bool):
                schema = {} if schema else {"not": {}}
            return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
        case "regex":
            return llguidance.LLMatcher.grammar_from_regex(spec.regex)
        case "tool_call":
            return llguidance.LLMatcher.grammar_from_lark(toolcall_lark(spec, JSON_OPTIONS))
    raise SpecError(f"unknown structured output kind {spec.kind!r}")
