"""Recipe: one request body in, a ResolvedRequest out.

body --parse--> ParsedRequest --model table--> ServedModel
     --resolve--> Conversation --render--> segments --encode--> prompt token ids

``prepare`` (serving) needs the ids; ``render_prompt`` gives the text without them where the
served vocabulary lacks a control token the prompt needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from dsi.recipe.chat_template import ChatTemplate
from dsi.recipe.conversation import ModelVersion
from dsi.recipe.encode import PromptEncoder, default_encoder
from dsi.recipe.errors import Protocol
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.protocol_chat import parse_chat
from dsi.recipe.protocol_messages import parse_messages
from dsi.recipe.protocol_responses import parse_responses
from dsi.recipe.request import ParsedRequest
from dsi.recipe.resolve import MAX_OUTPUT_TOKENS, RequestPrompt, ResolvedRequest, render_request, resolve
from dsi.recipe.resolve_template import resolve_templated
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
        self._templates: dict[Path, ChatTemplate] = {}

    def encoder_for(self, served: ServedModel) -> PromptEncoder:
        """The encoder of ``served``'s tokenizer file, loaded on first use."""
        if served.tokenizer is None:
            return self.encoder
        if served.tokenizer not in self._encoders:
            self._encoders[served.tokenizer] = PromptEncoder(served.tokenizer)
        return self._encoders[served.tokenizer]

    def template_for(self, served: ServedModel) -> ChatTemplate:
        """The chat template of ``served``'s model directory (another family), loaded on first use."""
        assert served.template_dir is not None, f"{served.name} renders a DeepSeek format"
        if served.template_dir not in self._templates:
            template = ChatTemplate.load(served.template_dir)
            if not template.byte_level:  # the streaming detokenizer reads byte-level ids only
                raise ValueError(f"{served.template_dir}: only byte-level BPE tokenizers can be served")
            self._templates[served.template_dir] = template
        return self._templates[served.template_dir]

    def prepare(self, protocol: Protocol, body: Body) -> ResolvedRequest:
        """Parse, validate, render and encode one request for serving. Raises RequestError,
        a 400 for a control token the served model's vocabulary lacks."""
        parsed, served = self._parse(protocol, body)
        if served.template_dir is not None:
            return resolve_templated(parsed, served, self.template_for(served), self.max_output_tokens)
        encoder = self.encoder_for(served)
        return resolve(parsed, served, encoder, self.default_thinking, self.max_output_tokens)

    def render_prompt(self, protocol: Protocol, body: Body) -> RequestPrompt:
        """One request's prompt text, and its ids where the served model's vocabulary has every
        control token the prompt needs (``dsi recipe render``). Raises RequestError where
        ``prepare`` does, except for a missing control token."""
        parsed, served = self._parse(protocol, body)
        if served.template_dir is not None:
            req = resolve_templated(parsed, served, self.template_for(served), self.max_output_tokens)
            return RequestPrompt(req.model_version, req.prompt, req.prompt_token_ids)
        encoder = self.encoder_for(served)
        return render_request(parsed, served, encoder, self.default_thinking, self.max_output_tokens)

    def _parse(self, protocol: Protocol, body: Body) -> tuple[ParsedRequest, ServedModel]:
        """The parsed request and the served model it names. Raises RequestError."""
        parser = PARSERS.get(protocol)
        if parser is None:
            raise fail(f"unknown protocol {protocol!r}")
        parsed = parser(body)
        return parsed, self.models.lookup(parsed.model)
