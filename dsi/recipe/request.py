"""ParsedRequest: what a protocol parser hands to the resolver, plus the checks all three
protocols share (tools, tool_choice, stop sequences, ranges)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from dsi.recipe.conversation import Effort, Message, ResponseFormat, ToolChoice, ToolResult, ToolSpec
from dsi.recipe.errors import Protocol
from dsi.recipe.schema import SchemaError, check_parameters, check_schema, check_tool_name, strict_schema
from dsi.recipe.wire import fail

MAX_STOP_SEQUENCES = 16
MAX_TOP_LOGPROBS = 20

# Client effort names -> the levels the templates know; "none" turns thinking off instead.
# "max" and "ultra" are DeepSeek's names beyond OpenAI's list.
EFFORTS: dict[str, Effort | None] = {
    "none": None,
    "minimal": Effort.LOW,
    "low": Effort.LOW,
    "medium": Effort.HIGH,
    "high": Effort.HIGH,
    "xhigh": Effort.XHIGH,
    "ultra": Effort.MAX,
    "max": Effort.MAX,
}
EffortName = Literal["none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max"]


@dataclass(slots=True, frozen=True)
class SamplingOptions:
    """Sampling settings as the client sent them (None: not sent)."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False  # extension (vLLM's): EOS neither ends the output nor shows in it
    stream: bool = False
    include_usage: bool = False
    parallel_tool_calls: bool = True
    user: str | None = None
    metadata: dict[str, Any] | None = None


@dataclass(slots=True, frozen=True)
class ThinkingRequest:
    """``enabled``: the client's explicit switch (None: not sent); ``effort``: the effort name
    it sent, with the parameter path it came from."""

    enabled: bool | None = None
    effort: EffortName | None = None
    effort_param: str = "reasoning_effort"


@dataclass(slots=True, frozen=True)
class ParsedRequest:
    """A validated request in protocol-neutral terms, before model defaults are applied."""

    protocol: Protocol
    model: str
    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    forced_tool: str | None = None
    tool_choice_param: str = "tool_choice"
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    thinking: ThinkingRequest = field(default_factory=ThinkingRequest)
    options: SamplingOptions = field(default_factory=SamplingOptions)
    max_tokens_param: str = "max_tokens"
    clamp_max_tokens: bool = False  # Messages lowers a too-large max_tokens instead of refusing
    echo: dict[str, Any] = field(default_factory=dict)  # request settings responses report back
    # thinking on: a required tool_choice is declared as auto and enforced after the reasoning
    # (Messages ``any``, which deepseek-recipe accepts with thinking) instead of refused
    required_after_reasoning: bool = False


def tool_spec(
    name: str,
    description: str | None,
    parameters: Any,
    strict: bool | None,
    param: str,
    default: Any = None,
    *,
    declared: bool = True,
    required: bool = False,
) -> ToolSpec:
    """A checked tool; a strict tool's parameters are normalized to strict form. ``default``
    stands for parameters the client left out (``required``: null is checked as a schema).
    A tool that is not ``declared`` (``tool_choice: none``) is never shown or called, so only
    its name is checked, as deepseek-recipe checks it."""
    check_tool_name(name, f"{param}.name")
    if not declared:
        return ToolSpec(name, description, parameters, strict)
    if parameters is None and not required:
        parameters = strict_schema({"type": "object"}) if strict and default is not None else default
    else:
        check_parameters(parameters, name, f"{param}.parameters")
        if strict:
            try:
                parameters = strict_schema(parameters)
            except SchemaError as exc:
                raise fail(f"Invalid schema for function '{name}': {exc}", f"{param}.parameters") from None
    return ToolSpec(name, description, parameters, strict)


def unique_tools(tools: list[ToolSpec], param: str, declared: bool = True) -> tuple[ToolSpec, ...]:
    """``tools``, whose names must differ when they are ``declared``."""
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.name in seen and declared:
            raise fail("Tool names must be unique.", f"{param}[{i}].name")
        seen.add(tool.name)
    return tuple(tools)


def choose_tool(
    choice: str, named: str | None, tools: tuple[ToolSpec, ...], param: str
) -> tuple[ToolChoice, str | None]:
    """``(tool_choice, forced_tool)`` for ``auto``/``none``/``required`` or a named tool. With no
    tools declared, a required or named choice is ``auto`` (as deepseek-recipe takes it)."""
    if choice in ("required", "named") and not tools:
        return "auto", None
    if choice == "named":
        if named not in {t.name for t in tools}:
            raise fail(
                f"Invalid value for '{param}': no function named '{named}' was specified in the "
                "'tools' parameter.",
                param,
            )
        return "required", named
    return choice, None  # type: ignore[return-value]


def check_tool_mix(
    tools: tuple[ToolSpec, ...],
    choice: ToolChoice,
    forced: str | None,
    fmt: ResponseFormat,
    fmt_param: str,
    fmt_given: bool,
) -> tuple[ToolSpec, ...]:
    """DeepSeek's rules on declared tools (``tool_choice: none`` declares none): strict and
    non-strict tools do not mix, strict tools do not mix with a response format. A named
    tool_choice leaves only that tool in the prompt."""
    if choice != "none" and any(t.strict for t in tools):
        if not all(t.strict for t in tools):
            raise fail("Cannot use strict tool with non-strict tool in the same request", "tools")
        if fmt_given:
            raise fail("response_format should not be used with tools", fmt_param)
    return tuple(t for t in tools if t.name == forced) if forced else tools


def response_schema(schema: Any, strict: bool | None, name: str | None, param: str) -> ResponseFormat:
    try:
        check_schema(schema)
        if strict:
            strict_schema(schema, empty_object_ok=False)  # the prompt shows the schema as sent
    except SchemaError as exc:
        raise fail(f"Invalid json schema: {exc}", param) from None
    return ResponseFormat("json_schema", schema, name, bool(strict))


def check_json_word(messages: tuple[Message, ...], fmt: ResponseFormat, param: str) -> None:
    """``json_object`` needs the word JSON somewhere in the conversation, as OpenAI requires."""
    if fmt.kind != "json_object":
        return
    for msg in messages:
        texts = [getattr(msg, "content", "")] + [p for p in getattr(msg, "parts", ()) if isinstance(p, str)]
        if any("json" in t.lower() for t in texts if isinstance(t, str)):
            return
    raise fail(
        "Prompt must contain the word 'json' in some form to use 'response_format' of type 'json_object'.",
        param,
    )


def check_stop(stop: str | list[str] | None, param: str) -> tuple[str, ...]:
    items = [stop] if isinstance(stop, str) else list(stop or [])
    if len(items) > MAX_STOP_SEQUENCES:
        raise fail(f"Stop string array too long: {len(items)} (at most {MAX_STOP_SEQUENCES})", param)
    for i, s in enumerate(items):
        if not s:
            raise fail(f"Invalid '{param}[{i}]': empty string.", f"{param}[{i}]")
    return tuple(items)


def check_range(value: float | None, lo: float, hi: float, param: str, lo_open: bool = False) -> None:
    if value is None:
        return
    bad = not math.isfinite(value) or value > hi or (value <= lo if lo_open else value < lo)
    if bad:
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise fail(f"Invalid {param} value, the valid range of {param} is {interval}", param)


def check_seed(seed: int | None, param: str = "seed") -> None:
    if seed is not None and not 0 <= seed < 2**63:
        raise fail(f"Invalid {param} value, the valid range of {param} is [0, 2^63)", param)


def check_top_logprobs(top_logprobs: int | None, logprobs: bool, param: str = "top_logprobs") -> int:
    if top_logprobs is None:
        return 0
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise fail(f"Invalid {param} value, the valid range of {param} is [0, {MAX_TOP_LOGPROBS}].", param)
    if not logprobs:
        raise fail("logprobs must be set to true if top_logprobs is used.", param)
    return top_logprobs


def check_tool_results(messages: list[tuple[Message, str]], calls: dict[int, set[str]]) -> None:
    """An assistant message's calls are answered by the tool results right after it, one each,
    before any other message; a tool result answers nothing else. ``messages``: (message, its
    request path); ``calls``: position of an assistant message -> the ids of its calls."""
    waiting: set[str] = set()  # calls of the last assistant message not answered yet
    asker = ""
    for i, (msg, param) in enumerate(messages):
        if not isinstance(msg, ToolResult):
            _check_all_answered(waiting, asker)
            waiting, asker = set(calls.get(i, ())), param
            continue
        if not waiting:
            raise fail(
                "Messages with role 'tool' must be a response to a preceding message with 'tool_calls'.",
                param,
            )
        if msg.call_id not in waiting:
            raise fail(
                f"Invalid parameter: tool_call_id '{msg.call_id}' was not found in the "
                "'tool_calls' of the preceding assistant message.",
                param,
            )
        waiting.discard(msg.call_id)
    _check_all_answered(waiting, asker)


def _check_all_answered(waiting: set[str], param: str) -> None:
    if waiting:
        raise fail(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: "
            f"{', '.join(sorted(waiting))}",
            param,
        )
