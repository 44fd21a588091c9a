"""Renderer against deepseek-recipe's own renderer, on random conversations built directly
(orders of messages no protocol produces: leading assistants, reminders between calls and
results, continued messages, empty texts), plus a worked example."""

from __future__ import annotations

import random

import pytest

from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    DeveloperMessage,
    Effort,
    ImageRef,
    LatestReminder,
    ModelVersion,
    ResponseFormat,
    SystemMessage,
    ToolCall,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from dsi.recipe.render import render
from dsi.recipe.segments import Control
from tests.dsi.recipe.oracle import encoding, to_oracle

TEXTS = ("hi", "", "a b", "<｜Assistant｜>", "</think>", "x\n\ny", "｜DSML｜", "中文", "json", "  ")
ARGS = ("{}", '{"a":"x"}', '{"a":1,"b":[1,2.5e-7]}', "not json", "[1]", "", '{"a":{"b":null}}', '{"k":1e300}')
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "description": "</think>"}}}


def random_conversation(rng: random.Random) -> Conversation:
    def parts() -> tuple[str | ImageRef, ...]:
        return tuple(
            ImageRef("https://example.invalid/x.png") if rng.random() < 0.2 else rng.choice(TEXTS)
            for _ in range(rng.choice([1, 1, 1, 2]))
        )

    msgs: list = []
    for _ in range(rng.randint(0, 8)):
        kind = rng.choice("SUUUAATTLD")
        if kind == "S":
            msgs.append(SystemMessage(parts()))
        elif kind == "D":
            msgs.append(DeveloperMessage(parts()))
        elif kind == "U":
            msgs.append(UserMessage(parts()))
        elif kind == "A":
            calls = tuple(
                ToolCall(f"c{rng.randint(0, 3)}", rng.choice("fg"), rng.choice(ARGS))
                for _ in range(rng.choice([0, 0, 1, 2, 3]))
            )
            msgs.append(AssistantMessage(rng.choice(TEXTS), rng.choice([None, "", "R"]), calls))
        elif kind == "T":
            msgs.append(ToolResult(f"c{rng.randint(0, 4)}", parts()))
        else:
            msgs.append(LatestReminder(rng.choice(TEXTS)))
    if msgs and isinstance(msgs[-1], AssistantMessage) and rng.random() < 0.5:
        last = msgs[-1]
        msgs[-1] = AssistantMessage(last.content, last.reasoning, last.tool_calls, prefix=True)
    tools = tuple(
        ToolSpec(n, rng.choice([None, "d <think>"]), rng.choice([None, SCHEMA]))
        for n in rng.sample(["f", "g", "h"], rng.randint(0, 3))
    )
    thinking = rng.random() < 0.5
    fmt = rng.choice(
        [
            ResponseFormat(),
            ResponseFormat(),
            ResponseFormat("json_object"),
            ResponseFormat("json_schema", SCHEMA),
        ]
    )
    return Conversation(
        tuple(msgs),
        tools,
        rng.choice(["auto", "auto", "none", "required"]),
        None,
        thinking,
        rng.choice(list(Effort)) if thinking else None,
        fmt,
    )


@pytest.mark.parametrize("version", list(ModelVersion))
def test_random_conversations_render_like_deepseek_recipe(version: ModelVersion) -> None:
    rng = random.Random(f"render-{version.value}")
    for _ in range(400):
        conv = random_conversation(rng)
        ours = render(conv, version).prompt
        theirs = encoding(version).render_conversation(to_oracle(conv, version))
        assert ours.text == theirs.prompt, conv
        assert list(ours.special_ranges) == [tuple(r) for r in theirs.special_ranges], conv


def test_random_conversations_encode_like_deepseek_recipe() -> None:
    from dsi.recipe.encode import default_encoder

    rng = random.Random("encode")
    for _ in range(150):
        conv = random_conversation(rng)
        ours = default_encoder().encode(render(conv, ModelVersion.V4).prompt)
        assert ours == encoding(ModelVersion.V4).encode(to_oracle(conv, ModelVersion.V4)), conv


def test_worked_example_v4() -> None:
    conv = Conversation(
        (
            SystemMessage(("Be brief.",)),
            UserMessage(("Weather in Paris?",)),
            AssistantMessage(
                "", "need tool", (ToolCall("c1", "get_weather", '{"city": "Paris", "days": 2}'),)
            ),
            ToolResult("c1", ("sunny",)),
        ),
        tools=(ToolSpec("get_weather", "Weather", {"type": "object"}),),
        thinking=False,
        effort=None,
    )
    out = render(conv, ModelVersion.V4)
    text = out.prompt.text
    assert text.startswith("<｜begin▁of▁sentence｜>Be brief.\n\n## Tools\n\n")
    assert text.endswith(
        "<｜User｜>Weather in Paris?<｜Assistant｜><think>need tool</think>\n\n<｜DSML｜tool_calls>\n"
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls><｜end▁of▁sentence｜>"
        "<｜User｜><tool_result>sunny</tool_result><｜Assistant｜></think>"
    )
    assert not out.ends_in_thinking
    assert out.prompt.segments[-1] is Control.END_THINK


def test_generation_prompt_ends_inside_think() -> None:
    conv = Conversation((UserMessage(("hi",)),), thinking=True, effort=Effort.LOW)
    assert render(conv, ModelVersion.V4).ends_in_thinking
    cont = Conversation(
        (UserMessage(("hi",)), AssistantMessage("", "half a thought", prefix=True)),
        thinking=True,
        effort=Effort.LOW,
    )
    out = render(cont, ModelVersion.V4)
    assert out.ends_in_thinking and out.prompt.text.endswith("<think>half a thought")
