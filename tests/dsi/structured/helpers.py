"""Checks shared by the structured-output tests: a small JSON Schema validator and a DSML parser."""

from __future__ import annotations

import json
import re

import torch

from dsi.structured import TokenConstraint, bitmask_words
from dsi.structured.vocab import VOCAB_SIZE

DSML = "｜DSML｜"
_INVOKE = re.compile(
    rf'<{DSML}invoke name="([^"]+)">\n((?:<{DSML}parameter .*?</{DSML}parameter>\n)*)</{DSML}invoke>\n', re.S
)
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]+)" string="(true|false)">(.*?)</{DSML}parameter>\n', re.S)
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def validate(value, schema) -> None:
    """Raise AssertionError unless ``value`` fits the (small) schema subset the tests use."""
    if "enum" in schema:
        assert value in schema["enum"], (value, schema["enum"])
    kind = schema.get("type")
    if kind == "integer":
        assert isinstance(value, int) and not isinstance(value, bool), value
    elif kind == "number":
        assert isinstance(value, int | float) and not isinstance(value, bool), value
    elif kind is not None:
        assert isinstance(value, _TYPES[kind]) and not (kind != "boolean" and isinstance(value, bool)), value
    if "minimum" in schema:
        assert value >= schema["minimum"]
    if "maximum" in schema:
        assert value <= schema["maximum"]
    if "maxLength" in schema:
        assert len(value) <= schema["maxLength"]
    if isinstance(value, dict):
        props = schema.get("properties", {})
        assert set(schema.get("required", ())) <= set(value), (value, schema.get("required"))
        if schema.get("additionalProperties") is False:
            assert set(value) <= set(props), value
        for key, sub in value.items():
            if key in props:
                validate(sub, props[key])
    if isinstance(value, list) and "items" in schema:
        for item in value:
            validate(item, schema["items"])


def parse_tool_calls(text: str, opener: bool = False) -> list[tuple[str, dict]]:
    """DSML tool-call text (``</｜DSML｜tool_calls>`` last; the opener first when ``opener``)
    -> [(name, arguments)]; string="true" values are raw text, string="false" values JSON."""
    if opener:
        assert text.startswith(f"\n\n<{DSML}tool_calls>\n"), text
        text = text.removeprefix(f"\n\n<{DSML}tool_calls>\n")
    assert text.endswith(f"</{DSML}tool_calls>"), text
    body = text.removesuffix(f"</{DSML}tool_calls>")
    calls, pos = [], 0
    for m in _INVOKE.finditer(body):
        assert m.start() == pos, f"unparsed text before an invoke: {body[pos : m.start()]!r}"
        pos = m.end()
        args = {}
        for name, is_string, raw in _PARAM.findall(m.group(2)):
            args[name] = raw if is_string == "true" else json.loads(raw)
        calls.append((m.group(1), args))
    assert pos == len(body) and calls, f"not a DSML tool-call block: {text!r}"
    return calls


def is_allowed(constraint: TokenConstraint, token: int) -> bool:
    bitmask = torch.zeros(bitmask_words(VOCAB_SIZE), dtype=torch.int32)
    constraint.fill_mask(bitmask)
    return bool((int(bitmask[token // 32]) >> (token % 32)) & 1)


def allowed(constraint: TokenConstraint) -> torch.Tensor:
    """The ids ``constraint`` allows next, as a sorted 1-D tensor."""
    bitmask = torch.zeros(bitmask_words(VOCAB_SIZE), dtype=torch.int32)
    constraint.fill_mask(bitmask)
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.flatten()[:VOCAB_SIZE].nonzero().flatten()
