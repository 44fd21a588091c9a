"""Generic chat-template rendering for model families other than DeepSeek (Llama, ...).

    Conversation --refuse DeepSeek-only features--> [{"role", "content"}]
                 --chat_template.jinja (the model's own, e.g. from GGUF metadata)--> prompt text
                 --tokenizer.json (special tokens parsed)--> token ids

A model directory written by ``dsi model import-gguf`` (or a Hugging Face checkpoint with
``tokenizer.json`` and a ``chat_template`` in ``tokenizer_config.json``) has everything needed.
The template is run in a sandboxed Jinja environment, as Hugging Face runs chat templates.

Injection safety (as for the DeepSeek formats, docs RECIPE.md): the template is rendered with
each message's content replaced by a marker, the text is cut at the markers, template pieces are
encoded with the special tokens parsed, and each content piece with the tokenizer *without* its
added vocabulary, so a client's ``<|im_end|>`` stays ordinary text. Where content follows
template text at a pre-tokenizer boundary (a newline, a special token), as in ChatML templates,
the ids equal those of encoding the whole text. A template that does not show each content
exactly once, as given, is encoded whole, and content that spells an added token is then refused.

DeepSeek-only features have no meaning in a generic template and are refused with
:class:`~dsi.errors.InvalidRequest` (a 400 at the gateway): tools and tool results, DSML tool
calls, reasoning content and reasoning effort (only ``None`` or the default ``high`` pass),
images, latest reminders, assistant prefixes, and a response format stated in the prompt.

The gateway renders the requests for a served model of another family with it
(dsi.recipe.resolve_template).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
from dsi.recipe.parser import ControlIds

_MARK = "\ue000{}\ue001"  # private-use characters around a message index: no template writes them
_MARKS = re.compile("\ue000([0-9]+)\ue001")
_NEVER = -1  # an id no token has: the DeepSeek markers the output parser must never see


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
    plain: object = field(default=None, repr=False)  # the tokenizer without its added vocabulary
    byte_level: bool = True  # the tokenizer decodes byte-level (what dsi.recipe.detok streams)
    _control: ControlIds | None = field(default=None, init=False, repr=False)
    _compiled: object = field(default=None, init=False, repr=False)  # jinja2 Template of `source`

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
        data = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
        tok = Tokenizer.from_str(json.dumps(data))
        byte_level = (data.get("decoder") or {}).get("type") == "ByteLevel"
        data["added_tokens"] = []
        plain = Tokenizer.from_str(json.dumps(data))
        bos, eos = _token(conf.get("bos_token")), _token(conf.get("eos_token"))
        return cls(source, tok, bos, eos, plain, byte_level)

    def prompt_text(self, conv: Conversation) -> str:
        """The rendered prompt, ending with the assistant turn's opening."""
        return self._render(plain_messages(conv))

    def _template(self) -> Any:  # a jinja2 Template (jinja2 is imported on first use)
        """The template compiled once (a request renders it twice; compiling is most of that)."""
        if self._compiled is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
            )
            env.globals["raise_exception"] = _raise
            self._compiled = env.from_string(self.source)
        return self._compiled

    def _render(self, messages: list[dict[str, str]]) -> str:
        return self._template().render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def render(self, conv: Conversation) -> list[int]:
        """Token ids of the prompt: template text with its special tokens parsed, message
        content as ordinary text (see the module docstring)."""
        messages = plain_messages(conv)
        marked = self._render([{**m, "content": _MARK.format(i)} for i, m in enumerate(messages)])
        pieces = _MARKS.split(marked)  # template, index, template, index, ..., template
        order = [int(i) for i in pieces[1::2]]
        if order != list(range(len(messages))):
            return self._render_whole(messages)
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            if k % 2:
                ids += self.plain.encode(messages[int(piece)]["content"], add_special_tokens=False).ids
            elif piece:
                ids += self.tokenizer.encode(piece, add_special_tokens=False).ids
        return ids

    def _render_whole(self, messages: list[dict[str, str]]) -> list[int]:
        added = [t.content for t in self.tokenizer.get_added_tokens_decoder().values()]
        for i, m in enumerate(messages):
            found = next((t for t in added if t in m["content"]), None)
            if found is not None:
                raise InvalidRequest(f"messages[{i}]: the content spells the model's control token {found!r}")
        return list(self.tokenizer.encode(self._render(messages), add_special_tokens=False).ids)

    def control_ids(self) -> ControlIds:
        """What the output parser acts on for this model: its EOS token (``eos_token`` of
        tokenizer_config.json) ends the message, every other special token is dropped from the
        text, and no DeepSeek marker (``<think>``, ``｜DSML｜``) exists."""
        if self._control is not None:
            return self._control
        eos = self.tokenizer.token_to_id(self.eos_token) if self.eos_token else None
        if eos is None:
            raise ValueError(f"the tokenizer has no EOS token {self.eos_token!r}")
        specials = {i for i, t in self.tokenizer.get_added_tokens_decoder().items() if t.special}
        self._control = ControlIds(eos, _NEVER, _NEVER, _NEVER, frozenset(specials - {eos}))
        return self._control


def _token(value: object) -> str:
    if isinstance(value, dict):  # an AddedToken as transformers saves one
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""


def _raise(message: str) -> None:
    raise InvalidRequest(f"chat template: {message}")
