"""Recipe: one request body in, a ResolvedRequest out.

body --parse--> ParsedRequest --model table--> ServedModel
     --resolve--> Conversation --render--> segments --encode--> prompt token ids
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dsi.recipe.conversation import ModelVersion
from dsi.recipe.encode import PromptEncoder, default_encoder
from dsi.recipe.errors import Protocol
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.protocol_chat import parse_chat
from dsi.recipe.protocol_messages import parse_messages
from dsi.recipe.protocol_responses import parse_responses
from dsi.recipe.request import ParsedRequest
from dsi.recipe.resolve import MAX_OUTPUT_TOKENS, ResolvedRequest, resolve
from dsi.recipe.wire import fail

Body = bytes | str | dict[str, Any]

PARSERS: dict[str, Callable[[Body], ParsedRequest]] = {
    "chat": parse_chat,
    "responses": parse_responses,
    "messages": parse_messages,
}


class Recipe:
    """Turns protocol requests into resolved, encoded requests.

    ``aliases``: extra model names (``{"dsi-tiny": ModelVersion.V4}``) next to DeepSeek's own;
    ``default_thinking``: thinking mode for requests that do not say; ``max_output_tokens``:
    the largest ``max_tokens`` accepted (Messages lowers larger values to it); ``encoder``:
    the encoder of the models that name no tokenizer file (default: the shipped V4 vocabulary).
    """

    def __init__(
        self,
        aliases: Mapping[str, ModelVersion | ServedModel] | None = None,
        *,
        models: ModelTable | None = None,
        default_thinking: bool = True,
        max_output_tokens: int = MAX_OUTPUT_TOKENS,
        encoder: PromptEncoder | None = None,
    ) -> None:
        self.models = models if models is not None else ModelTable(aliases)
        self.default_thinking = default_thinking
        self.max_output_tokens = max_output_tokens
        self.encoder = encoder or default_encoder()
        self._encoders: dict[Path, PromptEncoder] = {}

    def encoder_for(self, served: ServedModel) -> PromptEncoder:
        """The encoder of ``served``'s tokenizer file, loaded on first use."""
        if served.tokenizer is None:
            return self.encoder
        if served.tokenizer not in self._encoders:
            self._encoders[served.tokenizer] = PromptEncoder(served.tokenizer)
        return self._encoders[served.tokenizer]

    def prepare(self, protocol: Protocol, body: Body) -> ResolvedRequest:
        """Parse, validate, render and encode one request. Raises RequestError."""
        parser = PARSERS.get(protocol)
        if parser is None:
            raise fail(f"unknown protocol {protocol!r}")
        parsed = parser(body)
        served = self.models.lookup(parsed.model)
        encoder = self.encoder_for(served)
        return resolve(parsed, served, encoder, self.default_thinking, self.max_output_tokens)
