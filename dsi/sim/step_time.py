"""Decode step time: a linear model in the batch and its KV tokens, and its closed-form sums.

    step_s = fixed_s + batch * per_request_s + kv_tokens * per_kv_token_s      (seconds)

``of_shape`` derives the two slopes from a model shape and an assumed device: per_request_s =
the FLOPs of one decoded token (``dsi.model.flops.decode_flops``) / FLOP rate + the bytes a
request reads every step (its SWA rings and the latents the indexer selects per layer,
``dsi.kvcache.layout``) / bandwidth; per_kv_token_s = the indexer's bytes and FLOPs per KV token
per step (one fp8 key and scale per global entry, scored by every layer that sees global KV).
``fixed_s`` (weights, launches, expert all-to-all) is an assumption of the caller.

While a batch of ``b`` requests holding ``k`` KV tokens steps without a join or a leave, step i
(from 0) holds ``k + i * b`` tokens, so ``m`` steps take (:meth:`steps_s`)::

    T(m) = m * (fixed_s + b * per_request_s + k * per_kv_token_s) + per_kv_token_s * b * m (m - 1) / 2
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dsi.kvcache.layout import account
from dsi.model.config import ModelConfig
from dsi.model.flops import decode_flops


@dataclass(slots=True, frozen=True)
class StepTimeModel:
    """step_s = fixed_s + batch * per_request_s + kv_tokens * per_kv_token_s (seconds)."""

    fixed_s: float
    per_request_s: float
    per_kv_token_s: float

    def __post_init__(self) -> None:
        if min(self.fixed_s, self.per_request_s, self.per_kv_token_s) < 0:
            raise ValueError(f"step time terms must be >= 0, got {self}")
        if self.fixed_s + self.per_request_s <= 0:
            raise ValueError("a step must take time: fixed_s + per_request_s > 0")

    @classmethod
    def of_shape(
        cls, cfg: ModelConfig, flops_per_s: float, bytes_per_s: float, fixed_s: float
    ) -> StepTimeModel:
        acct = account(cfg)
        sees_global = [
            layer
            for layer in range(cfg.n_layers)
            if layer >= cfg.n_producer or cfg.source_of(layer) is not None
        ]
        topk = cfg.index_topk or cfg.max_context
        request_bytes = acct.state_slot + len(sees_global) * topk * acct.latent_entry
        # global entries per KV token that a step scores: 1 per consumer layer, 1/ratio per producer
        entries = sum(1.0 if layer >= cfg.n_producer else 1.0 / cfg.compress_ratio for layer in sees_global)
        far = 4 * topk * cfg.compress_ratio  # past the top-k cap: only the indexer grows
        kv_flops = (decode_flops(cfg, 2 * far) - decode_flops(cfg, far)) / far
        return cls(
            fixed_s,
            decode_flops(cfg, far) / flops_per_s + request_bytes / bytes_per_s,
            kv_flops / flops_per_s + entries * acct.index_entry / bytes_per_s,
        )

    def step_s(self, batch: int, kv_tokens: int) -> float:
        return self.fixed_s + batch * self.per_request_s + kv_tokens * self.per_kv_token_s

    def steps_s(self, batch: int, kv_tokens: int, steps: int) -> float:
        """Seconds of ``steps`` steps of ``batch`` requests that hold ``kv_tokens`` at the first."""
        first = self.step_s(batch, kv_tokens)
        return steps * first + self.per_kv_token_s * batch * steps * (steps - 1) / 2

    def steps_within(self, batch: int, kv_tokens: int, seconds: float) -> int:
        """The most whole steps (of ``batch`` requests holding ``kv_tokens`` at the first) that end
        within ``seconds``: the largest m with steps_s(m) <= seconds."""
        if seconds <= 0:
            return 0
        a = self.step_s(batch, kv_tokens)
        c = self.per_kv_token_s * batch / 2
        if c == 0:
            m = int(seconds / a)
        else:  # c m^2 + (a - c) m - seconds = 0
            b = a - c
            m = int((-b + math.sqrt(b * b + 4 * c * seconds)) / (2 * c))
        while m > 0 and self.steps_s(batch, kv_tokens, m) > seconds:
            m -= 1
        while self.steps_s(batch, kv_tokens, m + 1) <= seconds:
            m += 1
        return m
