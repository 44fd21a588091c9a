"""Generic chat-template rendering for model families other than DeepSeek (Llama, ...).

    Conversation --refuse DeepSeek-only features--> [{"role", "content"}]
                 --chat_template.jinja (the model's own, e.g. from GGUF metadata)--> prompt text
                 --tokenizer.json (special tokens parsed)--> token ids

A model directory written by ``dsi model import-gguf`` (or a Hugging Face checkpoint with
``tokenizer.json`` and a ``chat_template`` in ``tokenizer_config.json``) has everything needed.
The template is run in a sandboxed Jinja environment, as Hugging Face runs chat templates.

DeepSeek-only features have no meaning in a generic template and are refused with
:class:`~dsi.errors.InvalidRequest` (a 400 at the gateway): tools and tool results, DSML tool
calls, reasoning content and reasoning effort (only ``None`` or the default ``high`` pass),
images, latest reminders, assistant prefixes, and a response format stated in the prompt.

The gateway does not use this renderer yet: serving a non-DeepSeek family through
``dsi serve`` is planned.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dsi.errors import InvalidRequest
from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    DeveloperMessage,
    Effort,
    LatestReminder,
    SystemMessage,
    ToolResult,
    UserMessage,
)


def _text(parts: tuple, where: str) -> str:
    if any(not isinstance(p, str) for p in parts):
        raise InvalidRequest(f"{where}: images are not supported by this model family")
    return "".join(parts)


def plain_messages(conv: Conversation) -> list[dict[str, str]]:
    """The conversation as role/content pairs; raises InvalidRequest on a DeepSeek-only feature."""
    if conv.active_tools:
        raise InvalidRequest("tools are supported only by DeepSeek models")
    if conv.effort not in (None, Effort.HIGH):
        raise InvalidRequest("reasoning effort is supported only by DeepSeek models")
    if conv.response_format.kind != "text":
        raise InvalidRequest("response formats are not supported by this model family yet")
    out = []
    for i, m in enumerate(conv.messages):
        where = f"messages[{i}]"
        if isinstance(m, SystemMessage | DeveloperMessage):
            out.append({"role": "system", "content": _text(m.parts, where)})
        elif isinstance(m, UserMessage):
            out.append({"role": "user", "content": _text(m.parts, where)})
        elif isinstance(m, AssistantMessage):
            if m.tool_calls or m.reasoning or m.prefix or m.image:
                raise InvalidRequest(
                    f"{where}: tool calls, reasoning and prefixes are supported only by DeepSeek models"
                )
            out.append({"role": "assistant", "content": m.content})
        elif isinstance(m, ToolResult | LatestReminder):
            raise InvalidRequest(
                f"{where}: {type(m).__name__} messages are supported only by DeepSeek models"
            )
        else:
            raise InvalidRequest(f"{where}: unsupported message {type(m).__name__}")
    return out


@dataclass(slots=True)
class ChatTemplate:
    """A model's chat template and tokenizer: ``render(conv) -> token ids``."""

    source: str  # the Jinja template text
    tokenizer: object  # tokenizers.Tokenizer
    bos_token: str = ""
    eos_token: str = ""

    @classmethod
    def load(cls, directory: Path) -> ChatTemplate:
        """From ``chat_template.jinja`` (else ``tokenizer_config.json``'s chat_template) and
        ``tokenizer.json`` of a model directory."""
        from tokenizers import Tokenizer

        directory = Path(directory)
        conf_path = directory / "tokenizer_config.json"
        conf = json.loads(conf_path.read_text()) if conf_path.exists() else {}
        path = directory / "chat_template.jinja"
        source = path.read_text() if path.exists() else conf.get("chat_template")
        if not isinstance(source, str):
            raise ValueError(f"{directory}: no chat template (chat_template.jinja or tokenizer_config.json)")
        tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        return cls(source, tok, _token(conf.get("bos_token")), _token(conf.get("eos_token")))

    def prompt_text(self, conv: Conversation) -> str:
        """The rendered prompt, ending with the assistant turn's opening."""
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        return env.from_string(self.source).render(
            messages=plain_messages(conv),
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def render(self, conv: Conversation) -> list[int]:
        """Token ids of the prompt (special tokens of the template parsed as such)."""
        return list(self.tokenizer.encode(self.prompt_text(conv), add_special_tokens=False).ids)


def _token(value: object) -> str:
    if isinstance(value, dict):  # an AddedToken as transformers saves one
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise InvalidRequest(f"chat template: {message}")
