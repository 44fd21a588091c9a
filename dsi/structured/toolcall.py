"""The DSML tool-call grammar (V4 spelling), as an llguidance Lark grammar.

The bytes are those of the official V4 renderer (deepseek-recipe) for an assistant tool call;
``<D>`` is the control token ``｜DSML｜`` (id 128825), everything else is ordinary text::

    \\n\\n<D>tool_calls>\\n                                   (in the prompt for required/named)
    <D>invoke name="get_weather">\\n
    <D>parameter name="city" string="true">Paris</D>parameter>\\n      string-typed: raw text
    <D>parameter name="days" string="false">3</D>parameter>\\n         others: JSON, ", " and ": "
    </D>invoke>\\n
    ...more invokes...
    </D>tool_calls>                                            then EOS

Parameters come in the schema's property order; required ones must appear, optional ones may
be skipped. An object schema without ``properties`` (and not ``additionalProperties: false``)
takes any parameter names. With ``tool_choice: auto`` the block is optional and follows free
content text, which must then end in a blank line, as the renderer writes it.

Raw string values end at ``</`` + ``<D>``. The lexer is greedy and sees no special tokens
inside text, so a free value is a run of lazy segments, each ending at the first ``</``: after
each segment either ``<D>`` (the value ended) or more text follows. Bounded values (enum, const,
pattern, min/maxLength) are one lazy lexeme and so cannot contain ``</``.
"""

from __future__ import annotations

import json
from typing import Any

from dsi.structured.spec import SpecError, StructuredSpec, ToolSpec
from dsi.structured.vocab import DSML_ID

D = f"<[{DSML_ID}]>"
_ANY = "/(?s:.*)<\\//"


def toolcall_lark(spec: StructuredSpec, json_options: dict[str, Any]) -> str:
    """Lark text for a ``tool_call`` spec; ``json_options`` go into every ``%json`` value."""
    rules: list[str] = []
    names = []
    for i, tool in enumerate(spec.chosen_tools()):
        names.append(f"t{i}")
        rules += _invoke(f"t{i}", tool, json_options)
    calls = "invoke+" if spec.parallel_tool_calls else "invoke"
    head = [
        f"invoke: {' | '.join(names)}",
        f'calls: {calls} "</" {D} "tool_calls>"',
        f'opener: "<" {D} "tool_calls>\\n"',
    ]
    if spec.tool_choice == "auto":
        head += [
            "start: nlseg* TAIL? | nlseg+ opener calls",
            "nlseg[lazy]: /(?s:.*)\\n\\n/",
            "TAIL: /(?s:.+)/ & ~/(?s:.*)\\n\\n(?s:.*)/",
        ]
    elif spec.opener_in_prompt:
        head.append("start: calls")
    else:
        head.append('start: "\\n\\n" opener calls')
    if any(r.startswith(f"{n}_any:") for n in names for r in rules):
        rules.append('PNAME: /[^"<>\\n]+/')
    return "\n".join(["%llguidance {}", *head, *rules]) + "\n"


def _invoke(name: str, tool: ToolSpec, json_options: dict[str, Any]) -> list[str]:
    schema = json.loads(tool.parameters)
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    rules, parts = [], []
    for j, (key, sub) in enumerate(props.items()):
        rule = f"{name}_p{j}"
        parts.append(rule if key in required else f"{rule}?")
        rules += _param(rule, key, sub, json_options)
    if not props and schema.get("additionalProperties", True) is not False:
        parts.append(f"{name}_any*")
        rules += _any_param(f"{name}_any", json_options)
    body = " ".join(parts)
    rules.insert(
        0,
        f'{name}: "<" {D} {_lit(f"invoke name={_attr(tool.name)}>" + chr(10))} {body} "</" {D} "invoke>\\n"',
    )
    return rules


def _param(rule: str, key: str, sub: Any, json_options: dict[str, Any]) -> list[str]:
    if not isinstance(sub, dict):
        sub = {} if sub is True else {"not": {}}
    if _is_string(sub):
        head = _lit(f'parameter name={_attr(key)} string="true">')
        return [f'{rule}: "<" {D} {head} {rule}_v {D} "parameter>\\n"', *_raw_value(f"{rule}_v", sub)]
    head = _lit(f'parameter name={_attr(key)} string="false">')
    return [
        f'{rule}: "<" {D} {head} {rule}_v "</" {D} "parameter>\\n"',
        f"{rule}_v: %json {_json(sub, json_options)}",
    ]


def _any_param(rule: str, json_options: dict[str, Any]) -> list[str]:
    return [
        f'{rule}: "<" {D} "parameter name=\\"" PNAME "\\" string=\\"" ({rule}_s | {rule}_j) {D} '
        '"parameter>\\n"',
        f'{rule}_s: "true\\">" {rule}_seg+',
        f"{rule}_seg[lazy]: {_ANY}",
        f'{rule}_j: "false\\">" {rule}_jv "</"',
        f"{rule}_jv: %json {_json({}, json_options)}",
    ]


def _raw_value(rule: str, sub: dict[str, Any]) -> list[str]:
    """A raw string value followed by ``</`` (the token after it must be ``<D>``)."""
    body = _string_body(sub)
    if body is None:
        return [f"{rule}: {rule}_seg+", f"{rule}_seg[lazy]: {_ANY}"]
    return [f"{rule}[lazy]: /(?:{_slashes(body)})<\\//"]


def _string_body(sub: dict[str, Any]) -> str | None:
    """A regex for a bounded string value, or None for any text."""
    if "const" in sub:
        return _escape(sub["const"])
    if "enum" in sub:
        return "|".join(_escape(v) for v in sub["enum"])
    if "pattern" in sub:
        return sub["pattern"].removeprefix("^").removesuffix("$")
    lo, hi = sub.get("minLength"), sub.get("maxLength")
    if lo is None and hi is None:
        return None
    if not all(v is None or (isinstance(v, int) and v >= 0) for v in (lo, hi)):
        raise SpecError("minLength / maxLength must be non-negative integers")
    return f"(?s:.{{{lo or 0},{'' if hi is None else hi}}})"


def _is_string(sub: dict[str, Any]) -> bool:
    if "type" in sub:
        return sub["type"] == "string"
    values = sub["enum"] if "enum" in sub else [sub["const"]] if "const" in sub else None
    return bool(values) and all(isinstance(v, str) for v in values)


def _json(sub: dict[str, Any], json_options: dict[str, Any]) -> str:
    return json.dumps({**sub, "x-guidance": json_options}, ensure_ascii=False)


def _attr(value: str) -> str:
    if any(c in value for c in '"\n\r'):
        raise SpecError(f"name {value!r} cannot be written in a DSML attribute")
    return f'"{value}"'


def _lit(text: str) -> str:
    """A Lark string literal for ``text``."""
    return json.dumps(text, ensure_ascii=False)


def _escape(text: str) -> str:
    """``text`` as a regex matching exactly it (Rust regex syntax)."""
    return "".join("\\" + c if c in _META else c for c in text)


_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _slashes(regex: str) -> str:
    """Escape the unescaped ``/`` of a regex for Lark's ``/.../`` literal."""
    out, i = [], 0
    while i < len(regex):
        if regex[i] == "\\":
            out.append(regex[i : i + 2])
            i += 2
            continue
        out.append("\\/" if regex[i] == "/" else regex[i])
        i += 1
    return "".join(out)
