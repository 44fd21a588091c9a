"""Offline use: ``LLM(model_dir).generate(prompts, params)``."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.params import SamplingParams
from dsi.model.weights import load_model
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
        self.model_config, weights = load_model(Path(model_dir))
        self.engine = Engine(self.model_config, weights, config)
        self._ids = itertools.count()

    def generate(self, prompts: list[str | list[int]] | str, params: SamplingParams | list[SamplingParams] | None = None
                 ) -> list[Completion]:
        """Completions in prompt order. A string prompt is encoded with BOS; a list is token ids."""
        if isinstance(prompts, str):
            prompts = [prompts]
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(per) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or one for all")
        ids = [encode_text(p) if isinstance(p, str) else list(p) for p in prompts]
        names = [f"llm-{next(self._ids)}" for _ in prompts]
        for name, prompt, p in zip(names, ids, per, strict=True):
            self.engine.add_request(name, prompt, p)
        done = {}
        while len(done) < len(names):
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
        return [Completion(prompt, done[n].output, decode_ids(done[n].output), done[n].finish_reason,
                           done[n].logprobs or []) for n, prompt in zip(names, ids, strict=True)]

    def close(self) -> None:
        self.engine.close()
