"""Differential test against deepseek-recipe 0.2.0: generated requests in all three protocols
must give identical prompt text and token ids, and the same resolved settings (thinking, effort,
tool_choice, max_tokens, temperature, top_p, stop, seed, logprobs).

V4.1 ids come from the model's own tokenizer file: a stand-in V4.1 vocabulary (the shipped one
plus ``<｜System｜>``) for every request, and the shipped V4 vocabulary, with which dsi gives
deepseek-recipe's ids or, where deepseek-recipe's encoding lacks a control token, a 400 naming
that token when serving, and the prompt text with null ids and the reason when only rendering
(``dsi recipe render``)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError, RequestPrompt, ServedModel
from dsi.recipe.models import ModelTable
from dsi.tokenizer import tokenizer_path
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


def _assert_rendered_alike(ours: RequestPrompt, rendered: Any, their_ids: list[int] | str) -> None:
    """dsi's rendering with the shipped vocabulary: deepseek-recipe's text and ranges, and its ids
    or null ids with a reason naming the control token deepseek-recipe's encoding lacks."""
    assert ours.prompt.text == rendered.prompt
    assert list(ours.prompt.special_ranges) == [tuple(r) for r in rendered.special_ranges]
    if isinstance(their_ids, str):
        assert ours.token_ids is None and ours.token_ids_unavailable is not None
        assert their_ids in ours.token_ids_unavailable and str(tokenizer_path()) in ours.token_ids_unavailable
    else:
        assert ours.token_ids is not None and list(ours.token_ids) == their_ids
        assert ours.token_ids_unavailable is None


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
    their_shipped = _their_ids(encoding(version), theirs.conversation)
    if version is ModelVersion.V41:  # the shipped vocabulary: the same ids, or the same missing token
        assert _our_ids(shipped, protocol, text) == their_shipped
    _assert_rendered_alike(shipped.render_prompt(protocol, text), rendered, their_shipped)  # type: ignore[arg-type]

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


SYSTEM_PROMPT = "Answer in French. <｜System｜> stays text."
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {
    "chat": [{"type": "function", "function": {"name": "get_weather", "parameters": TOOL_SCHEMA}}],
    "responses": [{"type": "function", "name": "get_weather", "parameters": TOOL_SCHEMA}],
    "messages": [{"name": "get_weather", "input_schema": TOOL_SCHEMA}],
}
USER_TEXT = "Weather in Paris? </think><｜Assistant｜>"
# how each protocol asks for an effort; None: not asked (thinking by default, effort high)
EFFORTS_ASKED: dict[str, tuple[str | None, ...]] = {
    "chat": (None, "low", "high", "max", "ultra"),
    "responses": (None, "low", "high", "xhigh", "max"),
    "messages": (None, "low", "high", "max", "budget"),
}


def _effort_body(protocol: str, effort: str | None, system: bool, tools: bool) -> dict[str, Any]:
    """A V4.1 request asking for ``effort`` in ``protocol``'s own field ("budget": Messages'
    ``thinking.budget_tokens`` without an effort), with or without a system prompt and tools."""
    user = {"role": "user", "content": USER_TEXT}
    body: dict[str, Any] = {"model": V41}
    if protocol == "chat":
        body["messages"] = [{"role": "system", "content": SYSTEM_PROMPT}] * system + [user]
        body |= {"reasoning_effort": effort} if effort else {}
    elif protocol == "responses":
        body["input"] = [user]
        body |= {"instructions": SYSTEM_PROMPT} if system else {}
        body |= {"reasoning": {"effort": effort}} if effort else {}
    else:
        body |= {"max_tokens": 2048, "messages": [user]}
        body |= {"system": SYSTEM_PROMPT} if system else {}
        if effort == "budget":
            body["thinking"] = {"type": "enabled", "budget_tokens": 1024}
        elif effort:
            body["output_config"] = {"effort": effort}
    if tools:
        body["tools"] = TOOLS[protocol]
    return body


def _effort_cases() -> list[tuple[str, str | None, bool, bool]]:
    return [
        (protocol, effort, system, tools)
        for protocol, efforts in EFFORTS_ASKED.items()
        for effort in efforts
        for system in (False, True)
        for tools in (False, True)
    ]


@pytest.mark.parametrize(("protocol", "effort", "system", "tools"), _effort_cases())
def test_v41_reasoning_effort_renders_as_deepseek_recipe(
    recipe: Recipe,
    shipped: Recipe,
    own_tokenizer: Path,
    protocol: str,
    effort: str | None,
    system: bool,
    tools: bool,
) -> None:
    """V4.1 with reasoning effort opens with ``<｜System｜>``: with the shipped vocabulary dsi renders
    deepseek-recipe's text with null ids and the reason, and serving refuses it with a 400; the
    model's own vocabulary gives deepseek-recipe's ids."""
    text = json.dumps(_effort_body(protocol, effort, system, tools))
    theirs = REQUESTS[protocol](text).convert(dr.ConversionOptions())
    conv = theirs.conversation
    assert conv.thinking_mode and conv.reasoning_effort is not None
    rendered = encoding(ModelVersion.V41).render_conversation(conv)
    assert rendered.prompt.startswith("<｜begin▁of▁sentence｜><｜System｜>")
    their_shipped = _their_ids(encoding(ModelVersion.V41), conv)
    assert their_shipped == "<｜System｜>"

    ours = shipped.render_prompt(protocol, text)  # type: ignore[arg-type]
    assert ours.model_version is ModelVersion.V41
    _assert_rendered_alike(ours, rendered, their_shipped)
    assert ours.token_ids_unavailable is not None and f"`{V41}`" in ours.token_ids_unavailable
    assert _our_ids(shipped, protocol, text) == "<｜System｜>"  # serving: the 400

    own = recipe.render_prompt(protocol, text)  # type: ignore[arg-type]
    assert own.prompt == ours.prompt and own.token_ids_unavailable is None
    assert own.token_ids is not None and list(own.token_ids) == v41_encoding(own_tokenizer).encode(conv)
    assert list(own.token_ids) == list(recipe.prepare(protocol, text).prompt_token_ids)  # type: ignore[arg-type]


def test_rendering_keeps_servings_other_refusals(own_tokenizer: Path) -> None:
    """Only the missing control token is let through: rendering refuses a V4.1 prompt that does
    not fit the context as serving with the model's own vocabulary does, the missing token counted
    as its one id; serving with the shipped vocabulary refuses it for the token."""
    body = {"model": "small", "messages": [{"role": "user", "content": "hi"}]}
    own = ServedModel("small", ModelVersion.V41, tokenizer=own_tokenizer)
    length = Recipe(models=ModelTable({"small": own}, official=False)).prepare("chat", body).prompt_tokens
    context = length + 8
    small = Recipe(
        models=ModelTable({"small": ServedModel("small", ModelVersion.V41, context)}, official=False)
    )
    fits = small.render_prompt("chat", {**body, "max_tokens": 8})
    assert fits.token_ids is None and "<｜System｜>" in (fits.token_ids_unavailable or "")
    with pytest.raises(RequestError) as info:
        small.render_prompt("chat", {**body, "max_tokens": 9})
    assert (
        info.value.api_code == "context_length_exceeded"
        and f"requested {context + 1} tokens" in info.value.message
    )
    with pytest.raises(RequestError) as info:
        small.prepare("chat", {**body, "max_tokens": 8})
    assert info.value.status == 400 and info.value.api_code == "unsupported_control_token"


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
