"""Template pieces shared by the V4 and V4.1 prompt formats (texts as deepseek-recipe 0.2.0
renders them). Every function returns segments; client text only ever lands in ``str``
segments, never in :func:`~dsi.recipe.segments.template`."""

from __future__ import annotations

from dataclasses import dataclass

from dsi.recipe import jsontext
from dsi.recipe.conversation import Effort, ResponseFormat, ToolCall, ToolSpec
from dsi.recipe.segments import Control, Segment, template

V4_EFFORT_TEXT = {
    Effort.LOW: "",
    Effort.HIGH: (
        "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
        "You MUST be very thorough in your thinking and comprehensively decompose the problem to resolve "
        "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
        "and adversarial scenarios.\n"
        "Explicitly write out your entire deliberation process, documenting every intermediate step, "
        "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
        "unchecked.\n\n"
    ),
    Effort.MAX: (
        "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
        "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: exhaustively "
        "decompose the problem into its most fundamental components, trace every causal chain to its root, "
        "and resolve the underlying cause rather than any surface symptom.\n"
        "Do not stop reasoning until you have independently verified the solution from multiple angles and "
        "are certain that no assumption remains unchecked and no error remains undiscovered.\n\n"
    ),
}
V4_EFFORT_TEXT[Effort.XHIGH] = V4_EFFORT_TEXT[Effort.HIGH]

V41_EFFORT_LEVEL = {Effort.LOW: 50, Effort.HIGH: 75, Effort.XHIGH: 75, Effort.MAX: 100}


def v41_effort_text(effort: Effort) -> str:
    level = V41_EFFORT_LEVEL[effort]
    return (
        f"Reasoning Effort: {level} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
    )


@dataclass(slots=True, frozen=True)
class DsmlNames:
    """The words after ``｜DSML｜`` in tool-call blocks: V4 ``tool_calls``, V4.1 `` calls``."""

    calls: str
    invoke: str
    parameter: str
    empty_invoke_body: str  # between the invoke tags when a call has no parameters
    v4: bool  # V4 floats in JSON text (see jsontext)


V4_DSML = DsmlNames("tool_calls", "invoke", "parameter", "\n", True)
V41_DSML = DsmlNames(" calls", " invoke", " parameter", "\n\n", False)

_TOOLS_TEXT = """\n\n## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜{calls}>" block like the following:

<｜DSML｜{calls}>
<｜DSML｜{invoke} name="$TOOL_NAME">
<｜DSML｜{parameter} name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜{parameter}>
...
</｜DSML｜{invoke}>
<｜DSML｜{invoke} name="$TOOL_NAME2">
...
</｜DSML｜{invoke}>
</｜DSML｜{calls}>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

"""
_TOOLS_TAIL = (
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)


def tools_section(tools: tuple[ToolSpec, ...], names: DsmlNames) -> list[Segment]:
    """``\\n\\n## Tools ...`` with one JSON line per tool; empty without tools."""
    if not tools:
        return []
    head = _TOOLS_TEXT.format(calls=names.calls, invoke=names.invoke, parameter=names.parameter)
    lines = "\n".join(
        jsontext.dumps(
            {"name": t.name, "description": t.description or "", "parameters": t.parameters}, names.v4
        )
        for t in tools
    )
    return [*template(head), lines, _TOOLS_TAIL]


def response_format_section(fmt: ResponseFormat, v4: bool) -> list[Segment]:
    """The system-block paragraph for ``json_object`` / ``json_schema``; empty for text, for a
    regex and for a format not stated in the prompt."""
    if fmt.kind in ("text", "regex") or not fmt.in_prompt:
        return []
    if fmt.kind == "json_object" and v4:
        return [
            "\n\nYou are a helpful assistant designed to output JSON.\n## Response Format:\n\n"
            "Reply with JSON object ONLY."
        ]
    schema = {"type": "json_object"} if fmt.kind == "json_object" else fmt.schema
    return [
        "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        + jsontext.dumps(schema, v4)
    ]


def tool_calls_block(calls: tuple[ToolCall, ...], names: DsmlNames) -> list[Segment]:
    """``\\n\\n<｜DSML｜tool_calls>`` ... one invoke per call ... closing tag."""
    out: list[Segment] = ["\n\n<", Control.DSML, names.calls + ">\n"]
    for i, call in enumerate(calls):
        if i:
            out.append("\n")
        out += ["<", Control.DSML, f'{names.invoke} name="{call.name}">']
        params = _parameters(call.arguments)
        if not params:
            out.append(names.empty_invoke_body)
        else:
            out.append("\n")
            for j, (key, value) in enumerate(params):
                is_str = isinstance(value, str)
                text = value if is_str else jsontext.dumps(value, names.v4)
                if j:
                    out.append("\n")
                out += [
                    "<",
                    Control.DSML,
                    f'{names.parameter} name="{key}" string="{"true" if is_str else "false"}">',
                    text,
                    "</",
                    Control.DSML,
                    names.parameter + ">",
                ]
            out.append("\n")
        out += ["</", Control.DSML, names.invoke + ">"]
    out += ["\n</", Control.DSML, names.calls + ">"]
    return out


def required_call_opener(names: DsmlNames) -> list[Segment]:
    """What ``tool_choice: required`` appends to the generation prompt."""
    return ["\n\n<", Control.DSML, names.calls + ">\n"]


def _parameters(arguments: str) -> list[tuple[str, object]]:
    try:
        parsed = jsontext.loads(arguments)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return list(parsed.items())
    return [("arguments", arguments)]
