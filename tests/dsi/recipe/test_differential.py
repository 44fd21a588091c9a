"""Differential test against deepseek-recipe 0.2.0: generated requests in all three protocols
must give identical V4 token ids and identical V4.1 prompt text, and the same resolved
settings (thinking, effort, tool_choice, max_tokens, temperature, top_p, stop, seed, logprobs)."""

from __future__ import annotations

import json
import os
import random

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe
from tests.dsi.recipe import gen
from tests.dsi.recipe.oracle import encoding, version_of

CONTEXT = 1_048_576
SEEDS_PER_PROTOCOL = int(
    os.environ.get("DSI_RECIPE_SEEDS", "40")
)  # x 3 protocols; models alternate V4 / V4.1
REQUESTS = {
    "chat": dr.ChatCompletionRequest,
    "responses": dr.ResponsesRequest,
    "messages": dr.MessagesRequest,
}


@pytest.fixture(scope="module")
def recipe() -> Recipe:
    return Recipe()


def _cases() -> list[tuple[str, int]]:
    return [(p, s) for p in gen.GENERATORS for s in range(SEEDS_PER_PROTOCOL)]


@pytest.mark.parametrize(("protocol", "seed"), _cases())
def test_same_prompt_as_deepseek_recipe(recipe: Recipe, protocol: str, seed: int) -> None:
    rng = random.Random(f"{protocol}-{seed}")
    body = gen.GENERATORS[protocol](rng, gen.MODELS[seed % 2])
    text = json.dumps(body, ensure_ascii=seed % 3 == 0)  # both sides parse the same JSON text
    theirs = REQUESTS[protocol](text).convert(dr.ConversionOptions())
    ours = recipe.prepare(protocol, text.encode())  # type: ignore[arg-type]

    version = version_of(theirs.model_version)
    assert ours.model_version is version
    rendered = encoding(version).render_conversation(theirs.conversation)
    assert ours.prompt.text == rendered.prompt
    assert list(ours.prompt.special_ranges) == [tuple(r) for r in rendered.special_ranges]
    if version is ModelVersion.V4:
        assert list(ours.prompt_token_ids or ()) == encoding(version).encode(theirs.conversation)
    else:
        assert ours.prompt_token_ids is None

    conv = theirs.conversation
    assert ours.thinking == conv.thinking_mode
    assert (ours.effort.value if ours.effort else None) == conv.reasoning_effort
    assert ours.tool_choice == conv.tool_choice or (ours.tool_choice == "none" and not conv.tools)
    inference, parsing = theirs.inference_options, theirs.parsing_options
    assert ours.max_tokens == theirs.resolve_max_tokens(ours.prompt_tokens, CONTEXT)
    assert ours.temperature == pytest.approx(inference.temperature, abs=1e-6)
    assert ours.top_p == pytest.approx(inference.top_p, abs=1e-6)
    assert ours.seed == inference.seed
    assert ours.logprobs == inference.logprobs
    assert ours.top_logprobs == (inference.top_logprobs or 0)
    assert list(ours.stop) == parsing.stop_sequences
    assert ours.stream == theirs.stream
    stage = parsing.thinking_initial_stage
    assert ours.ends_in_thinking == (
        stage is not None and stage.starts_in_reasoning() and not parsing.starts_in_tool_calls
    )
    assert (ours.tool_choice == "required") == parsing.starts_in_tool_calls


def test_generated_requests_cover_the_features() -> None:
    """The generator really produces what the differential test claims to cover."""
    seen: set[str] = set()
    for protocol, seed in _cases():
        body = gen.GENERATORS[protocol](random.Random(f"{protocol}-{seed}"), gen.MODELS[seed % 2])
        text = repr(body)
        for marker in gen.MARKERS:
            if marker in text:
                seen.add(f"marker:{marker}")
        for effort in gen.EFFORTS:
            if f"'{effort}'" in text:
                seen.add(f"effort:{effort}")
        for feature in (
            "tool_calls",
            "function_call_output",
            "tool_result",
            "reasoning_content",
            "thinking",
            "json_object",
            "json_schema",
            "latest_reminder",
            "image",
            "prefix",
            "strict",
        ):
            if feature in text:
                seen.add(feature)
    missing = {f"marker:{m}" for m in gen.MARKERS} | {f"effort:{e}" for e in gen.EFFORTS}
    missing |= {
        "tool_calls",
        "function_call_output",
        "tool_result",
        "reasoning_content",
        "thinking",
        "json_object",
        "json_schema",
        "latest_reminder",
        "image",
        "prefix",
        "strict",
    }
    assert missing - seen == set()
