"""V4.1 prompts are encoded with the model's own tokenizer file. With the shipped V4 vocabulary a
request whose prompt needs no V4.1-only control token gets deepseek-recipe's ids; one that needs
``<｜System｜>`` gets a 400 naming it, in its protocol's error shape; with a vocabulary that has
the token, every V4.1 request gets deepseek-recipe's ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import deepseek_recipe as dr
import pytest

from dsi.recipe import ModelVersion, Recipe, RequestError, ServedModel, error_body
from dsi.recipe.models import ModelTable
from tests.dsi.recipe.oracle import (
    SYSTEM_TOKEN_ID,
    encoding,
    missing_token,
    v41_encoding,
    write_v41_tokenizer,
)

V41 = "DeepSeek-V4.1-Flash"
USER = [{"role": "user", "content": "hi <｜System｜> there"}]
REQUESTS = {
    "chat": dr.ChatCompletionRequest,
    "responses": dr.ResponsesRequest,
    "messages": dr.MessagesRequest,
}
NO_THINKING = {
    "chat": {"model": V41, "messages": USER, "thinking": {"type": "disabled"}},
    "responses": {"model": V41, "input": USER, "reasoning": {"effort": "none"}},
    "messages": {"model": V41, "max_tokens": 64, "messages": USER, "thinking": {"type": "disabled"}},
}
WITH_SYSTEM = {
    "chat": {"model": V41, "messages": [{"role": "system", "content": "Be brief."}, *USER]},
    "responses": {"model": V41, "input": USER, "instructions": "Be brief."},
    "messages": {"model": V41, "max_tokens": 64, "messages": USER, "system": "Be brief."},
}


@pytest.fixture(scope="module")
def own_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_v41_tokenizer(tmp_path_factory.mktemp("v41"))


def theirs(protocol: str, body: dict[str, Any]) -> Any:
    return REQUESTS[protocol](body).convert(dr.ConversionOptions()).conversation


@pytest.mark.parametrize("protocol", sorted(REQUESTS))
def test_within_the_shipped_vocabulary_ids_are_deepseek_recipes(protocol: str) -> None:
    body = NO_THINKING[protocol]
    ours = Recipe().prepare(protocol, body)  # type: ignore[arg-type]
    assert ours.model_version is ModelVersion.V41
    assert list(ours.prompt_token_ids) == encoding(ModelVersion.V41).encode(theirs(protocol, body))
    assert ours.prompt_tokens == len(ours.prompt_token_ids)
    assert "<｜System｜>" not in ours.prompt.text[: ours.prompt.text.index("hi")]  # no head: no token


@pytest.mark.parametrize("protocol", sorted(REQUESTS))
def test_a_control_token_the_vocabulary_lacks_is_a_400_naming_it(protocol: str) -> None:
    body = WITH_SYSTEM[protocol]
    with pytest.raises(RuntimeError) as their:
        encoding(ModelVersion.V41).encode(theirs(protocol, body))
    assert missing_token(their.value) == "<｜System｜>"
    with pytest.raises(RequestError) as info:
        Recipe().prepare(protocol, body)  # type: ignore[arg-type]
    err = info.value
    assert err.status == 400 and "<｜System｜>" in err.message and V41 in err.message
    shaped = error_body(err, protocol)  # type: ignore[arg-type]
    if protocol == "messages":
        assert shaped["type"] == "error" and shaped["error"]["type"] == "invalid_request_error"
        assert "<｜System｜>" in shaped["error"]["message"]
    else:
        assert shaped["error"]["code"] == "unsupported_control_token"
        assert "<｜System｜>" in shaped["error"]["message"]


@pytest.mark.parametrize("protocol", sorted(REQUESTS))
def test_the_models_own_tokenizer_file_encodes_every_v41_prompt(protocol: str, own_tokenizer: Path) -> None:
    table = ModelTable({V41: ServedModel(V41, ModelVersion.V41, tokenizer=own_tokenizer)})
    recipe = Recipe(models=table)
    for body in (WITH_SYSTEM[protocol], NO_THINKING[protocol]):
        ours = recipe.prepare(protocol, body)  # type: ignore[arg-type]
        assert list(ours.prompt_token_ids) == v41_encoding(own_tokenizer).encode(theirs(protocol, body))
    assert ours.prompt_token_ids.count(SYSTEM_TOKEN_ID) == 0  # client text never becomes the token
    with_system = recipe.prepare(protocol, WITH_SYSTEM[protocol])  # type: ignore[arg-type]
    assert with_system.prompt_token_ids[1] == SYSTEM_TOKEN_ID
    assert with_system.prompt_token_ids.count(SYSTEM_TOKEN_ID) == 1
