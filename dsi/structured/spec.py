"""StructuredSpec: what a request's output must look like, as hashable data.

One spec per request, carried in ``SamplingParams.structured``. It is a frozen msgspec struct
whose fields are strings, booleans and tuples, so a spec (and the SamplingParams holding it)
hashes, compares by value, keys the grammar cache and travels on the wire. Schemas are kept as
compact JSON text, property order preserved (the order the grammar emits properties in).

Kinds, and what the output after the constraint starts must be:

    json_object   one JSON object
    json_schema   one JSON value valid against ``schema``
    regex         text matching ``regex`` in full
    tool_call     a DSML tool-call block over ``tools``; see dsi.structured.toolcall

``after_think``: the generation starts inside a reasoning section (the prompt ends in
``<think>``); tokens up to and including ``</think>`` are not constrained.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

Kind = Literal["json_object", "json_schema", "regex", "tool_call"]
KINDS = ("json_object", "json_schema", "regex", "tool_call")


class SpecError(ValueError):
    """A spec that cannot be compiled; the message says which field and why."""


# Both travel inside SamplingParams on the control plane: unknown fields are ignored there, so
# that a peer one protocol version older or newer still decodes them (dsi.messages.version).
class ToolSpec(msgspec.Struct, frozen=True):
    name: str
    parameters: str = '{"type":"object"}'  # JSON Schema of the arguments, as JSON text

    @classmethod
    def of(cls, tool: ToolSpec | Mapping[str, Any]) -> ToolSpec:
        """From a ToolSpec, ``{"name", "parameters"}``, or a Chat Completions function tool
        ``{"type": "function", "function": {"name", "parameters"}}``."""
        if isinstance(tool, ToolSpec):
            return tool
        fn = tool.get("function", tool)
        params = fn.get("parameters")
        return cls(fn["name"], _schema_text({"type": "object"} if params is None else params))


class StructuredSpec(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: Kind
    schema: str = ""  # json_schema: the JSON Schema as JSON text
    regex: str = ""  # regex: the pattern (Rust regex syntax, matched in full)
    tools: tuple[ToolSpec, ...] = ()  # tool_call: the callable tools
    tool_choice: str = "required"  # tool_call: "required", "auto", or the one tool's name
    parallel_tool_calls: bool = True  # tool_call: more than one invoke allowed
    # tool_call required/named: the prompt already ends with "<｜DSML｜tool_calls>\n" (the
    # official V4 rendering prefills it); False makes the grammar emit "\n\n" + that opener.
    opener_in_prompt: bool = True
    after_think: bool = False

    # ---- constructors ----------------------------------------------------------------------------
    @classmethod
    def json_object(cls, *, after_think: bool = False) -> StructuredSpec:
        return cls("json_object", after_think=after_think)

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str, *, after_think: bool = False) -> StructuredSpec:
        return cls("json_schema", schema=_schema_text(schema), after_think=after_think)

    @classmethod
    def for_regex(cls, pattern: str, *, after_think: bool = False) -> StructuredSpec:
        return cls("regex", regex=pattern, after_think=after_think)

    @classmethod
    def tool_call(
        cls,
        tools: Iterable[ToolSpec | Mapping[str, Any]],
        choice: str = "required",
        *,
        parallel: bool = True,
        opener_in_prompt: bool = True,
        after_think: bool = False,
    ) -> StructuredSpec:
        return cls(
            "tool_call",
            tools=tuple(ToolSpec.of(t) for t in tools),
            tool_choice=choice,
            parallel_tool_calls=parallel,
            opener_in_prompt=opener_in_prompt,
            after_think=after_think,
        )

    @classmethod
    def from_output_constraint(cls, kind: str, schema: str, *, after_think: bool = False) -> StructuredSpec:
        """From deepseek-recipe's ``OutputConstraint`` (``kind``, ``schema``): ``json`` (a schema,
        or "" for JSON mode), ``regex``, ``tool_call`` (strict tools, choice auto) and
        ``tool_call_required`` (required or named; the prompt holds the opener). ``schema`` is
        then a JSON array of Chat Completions function tools; deferred tools are left out."""
        match kind:
            case "json":
                return (
                    cls.json_schema(schema, after_think=after_think)
                    if schema
                    else cls.json_object(after_think=after_think)
                )
            case "regex":
                return cls.for_regex(schema, after_think=after_think)
            case "tool_call" | "tool_call_required":
                tools = json.loads(schema)
                loaded = [t for t in tools if not t.get("defer_loading")] or tools
                choice = "auto" if kind == "tool_call" else "required"
                return cls.tool_call(loaded, choice, after_think=after_think)
        raise SpecError(f"unknown output constraint kind {kind!r}")

    # ---- checks ------------------------------------------------------------------------------------
    def check(self) -> None:
        """Shape checks that need no grammar engine; raises SpecError."""
        if self.kind not in KINDS:
            raise SpecError(f"structured output kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind == "json_schema":
            self.schema_obj()
        if self.kind == "regex" and not self.regex:
            raise SpecError("regex: the pattern is empty")
        if self.kind == "tool_call":
            self._check_tools()

    def schema_obj(self) -> dict[str, Any] | bool:
        return _parse_schema(self.schema, "json_schema")

    def chosen_tools(self) -> tuple[ToolSpec, ...]:
        """The tools the output may call: all of them, or only the named one."""
        if self.tool_choice in ("required", "auto"):
            return self.tools
        return tuple(t for t in self.tools if t.name == self.tool_choice)

    def _check_tools(self) -> None:
        if not self.tools:
            raise SpecError("tool_call: no tools given")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise SpecError("tool_call: tool names must be unique")
        for tool in self.tools:
            if not tool.name or any(c in tool.name for c in '"<>\n\r'):
                raise SpecError(
                    f'tool_call: tool name {tool.name!r} is empty or has one of " < > or a newline'
                )
            schema = _parse_schema(tool.parameters, f"tool {tool.name!r} parameters")
            if not isinstance(schema, dict) or schema.get("type", "object") != "object":
                raise SpecError(f"tool_call: tool {tool.name!r} parameters must be an object schema")
        if self.tool_choice not in ("required", "auto") and not self.chosen_tools():
            raise SpecError(
                f"tool_call: tool_choice names {self.tool_choice!r}, which is not among the tools"
            )


def _schema_text(schema: Mapping[str, Any] | bool | str) -> str:
    """Compact JSON text, key order kept; text input is parsed first so equal schemas match."""
    obj = _parse_schema(schema, "schema") if isinstance(schema, str) else schema
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def _parse_schema(text: str, what: str) -> dict[str, Any] | bool:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{what}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict | bool):
        raise SpecError(f"{what}: a JSON Schema must be an object or a boolean")
    return obj
