"""Offline use: ``LLM(model_dir).generate(prompts, params)``.

A V4 directory encodes text with the shipped V4 tokenizer; another family's directory (Llama, as
``dsi model import-gguf`` writes one) with its own ``tokenizer.json``, and ``chat`` renders a
conversation with its own chat template (:mod:`dsi.recipe.chat_template`)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.family import load_model_dir
from dsi.tokenizer import decode_ids, encode_text


@dataclass(slots=True)
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[float]


class LLM:
    """An engine over a model directory (``config.json`` + ``model.safetensors``)."""

    def __init__(self, model_dir: str | Path, config: EngineConfig | None = None) -> None:
        self.model_config, weights = load_model_dir(Path(model_dir))
        if config is None and self.model_config.family != "v4":
            # A dense page holds every layer's K and V (5.6 MiB for SmolLM2-135M): the default 1,024
            # pages would take gigabytes, so hold one sequence of the full context length instead.
            cfg = self.model_config
            config = EngineConfig(
                num_blocks=1 + -(-cfg.max_context // cfg.block_size), num_slots=4, max_running=4
            )
        self.engine = Engine(self.model_config, weights, config)
        self._ids = itertools.count()
        self._template = None
        if self.model_config.family != "v4":
            from dsi.recipe.chat_template import ChatTemplate

            self._template = ChatTemplate.load(Path(model_dir))

    def _encode(self, text: str) -> list[int]:
        if self._template is None:
            return encode_text(text)
        return list(self._template.tokenizer.encode(text, add_special_tokens=False).ids)

    def _decode(self, ids: list[int]) -> str:
        if self._template is None:
            return decode_ids(ids)
        return self._template.tokenizer.decode(ids, skip_special_tokens=True)

    def chat_ids(self, user_text: str) -> list[int]:
        """A one-turn chat prompt in the model's own chat template (non-DeepSeek families; the
        V4 prompt format is the gateway's recipe)."""
        if self._template is None:
            raise ValueError(
                "chat rendering here is for non-DeepSeek families; V4 chats go through the gateway"
            )
        from dsi.recipe.conversation import Conversation, UserMessage

        return self._template.render(Conversation((UserMessage((user_text,)),)))

    def generate(
        self,
        prompts: list[str | list[int]] | str,
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Completions in prompt order. A string prompt is encoded with the model's tokenizer (V4: with
        BOS); a list is token ids."""
        if isinstance(prompts, str):
            prompts = [prompts]
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(per) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        ids = [self._encode(p) if isinstance(p, str) else list(p) for p in prompts]
        names = [f"llm-{next(self._ids)}" for _ in prompts]
        for name, prompt, p in zip(names, ids, per, strict=True):
            self.engine.add_request(name, prompt, p)
        done = {}
        while len(done) < len(names):
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [
            Completion(
                prompt,
                done[n].output,
                self._decode(done[n].output),
                done[n].finish_reason,
                done[n].logprobs or [],
            )
            for n, prompt in zip(names, ids, strict=True)
        ]

    def close(self) -> None:
        self.engine.close()
