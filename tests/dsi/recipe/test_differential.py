"""Differential test against deepseek-recipe 0.2.0: generated requests in all three protocols
must give identical prompt text and token ids, and the same resolved settings (thinking, effort,
tool_choice, max_tokens, temperature, top_p, stop, seed, logprobs).

V4.1 ids come from the model's own tokenizer file: a stand-in V4.1 vocabulary (the shipped one
plus ``<｜System｜>``) for every request, and the shipped V4 vocabulary, with which dsi gives
deepseek-recipe's ids or, where deepseek-recipe's encoding lacks a control token, a 400 naming
that token."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError, ServedModel
from dsi.recipe.models import ModelTable
from tests.dsi.recipe import gen
from tests.dsi.recipe.oracle import encoding, missing_token, v41_encoding, version_of, write_v41_tokenizer

CONTEXT = 1_048_576
SEEDS_PER_PROTOCOL = int(
    os.environ.get("DSI_RECIPE_SEEDS", "40")
)  # x 3 protocols; models alternate V4 / V4.1
REQUESTS = {
    "chat": dr.ChatCompletionRequest,
    "responses": dr.ResponsesRequest,
    "messages": dr.MessagesRequest,
}


V41 = "DeepSeek-V4.1-Flash"


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_v41_tokenizer(tmp_path_factory.mktemp("v41"))


@pytest.fixture(scope="module")
def recipe(own_tokenizer: Path) -> Recipe:
    """V4.1 with its own (stand-in) tokenizer file."""
    return Recipe(models=ModelTable({V41: ServedModel(V41, ModelVersion.V41, tokenizer=own_tokenizer)}))


@pytest.fixture(scope="module")
def shipped() -> Recipe:
    """Every model with the shipped V4 vocabulary."""
    return Recipe()


def _cases() -> list[tuple[str, int]]:
    return [(p, s) for p in gen.GENERATORS for s in range(SEEDS_PER_PROTOCOL)]


def _their_ids(enc: Any, conv: Any) -> list[int] | str:
    """deepseek-recipe's ids, or the control token its vocabulary lacks."""
    try:
        return enc.encode(conv)
    except RuntimeError as exc:
        token = missing_token(exc)
        assert token is not None, exc
        return token


def _our_ids(recipe: Recipe, protocol: str, text: str) -> list[int] | str:
    """dsi's ids, or the control token named by its 400."""
    try:
        return list(recipe.prepare(protocol, text).prompt_token_ids)  # type: ignore[arg-type]
    except RequestError as err:
        assert err.status == 400 and err.api_code == "unsupported_control_token", err
        return next(t for t in ("<｜System｜>", "<｜image｜>") if t in err.message)


@pytest.mark.parametrize(("protocol", "seed"), _cases())
def test_same_prompt_as_deepseek_recipe(
    recipe: Recipe, shipped: Recipe, own_tokenizer: Path, protocol: str, seed: int
) -> None:
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
    own = encoding(version) if version is ModelVersion.V4 else v41_encoding(own_tokenizer)
    assert list(ours.prompt_token_ids) == own.encode(theirs.conversation)
    if version is ModelVersion.V41:  # the shipped vocabulary: the same ids, or the same missing token
        assert _our_ids(shipped, protocol, text) == _their_ids(encoding(version), theirs.conversation)

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


@pytest.mark.parametrize(("protocol", "seed"), _cases()[::4])
def test_v41_within_the_shipped_vocabulary(shipped: Recipe, protocol: str, seed: int) -> None:
    """V4.1 requests whose prompt needs no ``<｜System｜>``: ids from the shipped vocabulary."""
    body = gen.without_system_token(
        gen.GENERATORS[protocol](random.Random(f"{protocol}-{seed}"), V41), protocol
    )
    text = json.dumps(body)
    conv = REQUESTS[protocol](text).convert(dr.ConversionOptions()).conversation
    theirs = encoding(ModelVersion.V41).encode(conv)
    ours = shipped.prepare(protocol, text)  # type: ignore[arg-type]
    assert ours.model_version is ModelVersion.V41 and not ours.thinking
    assert list(ours.prompt_token_ids) == theirs


FEATURES = (
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
    "'budget_tokens'",
    "'regex'",
    "'original'",
    "'defer_loading'",
    "'web_search_call'",
    "'web_search_2025_08_26'",
    "'phase'",
    "'input_file'",
    "'document'",
    "'image/jpg'",
    "'file_id'",
    "_" * 60,  # a tool name longer than OpenAI's 64 characters
)


def _features(protocol: str, body: dict[str, Any]) -> set[str]:
    text = repr(body)
    seen = {f"marker:{m}" for m in gen.MARKERS if m in text}
    seen |= {f"effort:{e}" for e in gen.EFFORTS if f"'{e}'" in text}
    seen |= {f for f in FEATURES if f in text}
    if protocol == "messages":
        if any(m["role"] == "system" for m in body["messages"]):
            seen.add("messages:system-role")
        budget = body.get("thinking", {}).get("budget_tokens")
        if budget is not None and budget >= body.get("max_tokens", 0):
            seen.add("messages:budget>=max_tokens")
        if "max_tokens" not in body:
            seen.add("messages:no-max_tokens")
    return seen


def test_generated_requests_cover_the_features() -> None:
    """The generator really produces what the differential test claims to cover."""
    seen: set[str] = set()
    for protocol, seed in _cases():
        seen |= _features(
            protocol, gen.GENERATORS[protocol](random.Random(f"{protocol}-{seed}"), gen.MODELS[seed % 2])
        )
    wanted = {f"marker:{m}" for m in gen.MARKERS} | {f"effort:{e}" for e in gen.EFFORTS} | set(FEATURES)
    wanted |= {"messages:system-role", "messages:budget>=max_tokens", "messages:no-max_tokens"}
    assert wanted - seen == set()
