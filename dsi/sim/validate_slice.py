"""The workload of ``dsi sim validate``: a small slice of a Mooncake trace, as chat requests for
``dsi serve`` and as the simulator's requests, made of the same token ids.

The slice and the prompts are those of ``dsi bench vllm-cluster`` (:mod:`dsi.bench.vllm_cluster_trace`):
requests in trace order that share at least ``min_shared_ids`` leading 512-token ids with an
earlier one (with that earlier one), each id written as ``tokens_per_id`` words that are one V4
token each, at most ``max_prompt_tokens // tokens_per_id`` ids, ``min(output_length,
max_output_tokens)`` output tokens with EOS ignored. Each prompt is rendered by the gateway's
recipe (the V4 chat format, thinking off) into the token ids the gateway will compute, and those
ids are hashed with the real chain over the tiny model's 128-token pages, so the simulator's
requests share exactly the pages the served ones do.

Arrivals are open loop: the trace's timestamps (from the slice's first) divided by a time scale
chosen so that the slice arrives at ``rate`` requests per second on average.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dsi import paths
from dsi.bench.vllm_cluster_trace import Scaling, read_trace, vocabulary_words, workload
from dsi.kvcache.hashchain import HashChain, keys_of
from dsi.model.config import TINY
from dsi.recipe import ModelVersion, Recipe
from dsi.sim.workload import SimRequest
from dsi.tokenizer import tokenizer_path

TRACE_LINES = 4000  # lines read from the trace: enough for any slice a validation asks for


@dataclass(slots=True, frozen=True)
class SliceConfig:
    """Which requests, how small, how fast. Tokens and requests per second."""

    trace: Path | None = None  # None: dsi.paths.trace(), the conversation trace
    requests: int = 40
    tokens_per_id: int = 48
    max_prompt_tokens: int = 1536
    max_output_tokens: int = 16
    rate: float = 0.5  # mean arrivals per second after scaling

    def __post_init__(self) -> None:
        if self.requests < 2 or not self.rate > 0:
            raise ValueError(f"a validation slice needs >= 2 requests and rate > 0, got {self}")

    @property
    def scaling(self) -> Scaling:
        return Scaling(self.requests, self.tokens_per_id, self.max_prompt_tokens, self.max_output_tokens)


@dataclass(slots=True, frozen=True)
class ServedRequest:
    """One request of the slice: when it is sent (seconds from the replay's start), the body
    posted to ``/v1/chat/completions``, and the same request for the simulator."""

    arrival_s: float
    body: dict
    sim: SimRequest


@dataclass(slots=True, frozen=True)
class Slice:
    requests: list[ServedRequest]
    time_scale: float  # trace seconds per replayed second
    trace_lines_spanned: int

    def describe(self) -> dict:
        sims = [r.sim for r in self.requests]
        return {
            "requests": len(sims),
            "prompt_tokens": sum(r.prompt_tokens for r in sims),
            "output_tokens": sum(r.output_tokens for r in sims),
            "span_s": round(sims[-1].arrival_s, 3),
            "time_scale": round(self.time_scale, 3),
            "trace_lines_spanned": self.trace_lines_spanned,
        }


def chat_body(model: str, text: str, max_tokens: int) -> dict:
    """One user turn, greedy, streamed with usage, thinking off, EOS ignored."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "thinking": {"type": "disabled"},
        "ignore_eos": True,
    }


def time_scale(timestamps_s: list[float], rate: float) -> float:
    """The factor that makes ``timestamps_s`` (sorted) arrive at ``rate`` per second on average
    (1.0 when they all share one instant)."""
    span = timestamps_s[-1] - timestamps_s[0]
    return span * rate / (len(timestamps_s) - 1) if span > 0 else 1.0


def build_slice(cfg: SliceConfig, model: str) -> Slice:
    """The slice of ``cfg.trace`` for a cluster serving ``model`` (a V4-format model name)."""
    trace = cfg.trace or paths.trace()
    rows = read_trace(trace, TRACE_LINES)
    picked = workload(rows, cfg.scaling, vocabulary_words(tokenizer_path()))
    if len(picked) < 2:
        raise ValueError(f"{trace}: fewer than 2 requests share a prefix in its first {TRACE_LINES} lines")
    stamps = [rows[r.trace_index].timestamp_ms / 1000.0 for r in picked]
    scale = time_scale(stamps, cfg.rate)
    recipe = Recipe({model: ModelVersion.V4})
    chain = HashChain(root_seed=0, model=model, block_size=TINY.block_size)
    out = []
    for i, (req, stamp) in enumerate(zip(picked, stamps, strict=True)):
        body = chat_body(model, req.text, req.max_tokens)
        ids = list(recipe.prepare("chat", json.dumps(body)).prompt_token_ids)
        keys = keys_of(chain.hashes(ids[: len(ids) // TINY.block_size * TINY.block_size]))
        arrival = (stamp - stamps[0]) / scale
        sim = SimRequest(
            id=i,
            arrival_s=arrival,
            prompt_tokens=len(ids),
            output_tokens=req.max_tokens,
            keys=keys,
            persist_keys=keys,
        )
        out.append(ServedRequest(arrival, body, sim))
    return Slice(out, scale, picked[-1].trace_index + 1)
