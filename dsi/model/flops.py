"""FLOP count of a prefill, analytically, for any config (``flash`` included).

Counts 2 x multiply-adds of the useful work: projections, MoE (routed top-k + shared), and
attention over the keys each query really sees - SWA ``min(window, t + 1 - start)`` keys plus
the global entries visible at t (capped by the indexer's top-k where the config has one, plus
the indexer's own scoring over every visible entry). Logits only for the last position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsi.model.config import ModelConfig
from dsi.model.reference import consumer_start


@dataclass(slots=True, frozen=True)
class PrefillFlops:
    producer: float
    boundary: float
    consumer: float
    logits: float

    @property
    def total(self) -> float:
        return self.producer + self.boundary + self.consumer + self.logits


def _dense_per_token(cfg: ModelConfig) -> float:
    h, d = cfg.hidden, cfg.head_dim
    proj = h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * d
    moe = h * cfg.n_experts + 3 * h * (cfg.top_k * cfg.expert_dim + cfg.shared_dim)
    return 2.0 * (proj + moe)


def _attention(cfg: ModelConfig, pos: np.ndarray, swa_start: int, visible_global: np.ndarray | None) -> float:
    swa = np.minimum(cfg.window, pos + 1 - swa_start).astype(np.float64)
    keys = swa.sum()
    index = 0.0
    if visible_global is not None:
        vis = visible_global.astype(np.float64)
        keys += (np.minimum(vis, cfg.index_topk) if cfg.index_topk else vis).sum()
        if cfg.index_dim:
            index = 2.0 * cfg.index_dim * vis.sum()
    return 4.0 * cfg.n_heads * cfg.head_dim * keys + index


def prefill_flops(cfg: ModelConfig, prompt_len: int, keep: int | None) -> PrefillFlops:
    pos = np.arange(prompt_len)
    producer = 0.0
    for layer in range(cfg.n_producer):
        vis = (pos + 1) // cfg.compress_ratio if cfg.source_of(layer) is not None else None
        producer += prompt_len * _dense_per_token(cfg) + _attention(cfg, pos, 0, vis)
        if layer in cfg.kv_sources:
            producer += 2.0 * prompt_len * cfg.hidden * cfg.head_dim  # compressor
    start = consumer_start(prompt_len, keep)
    cpos = pos[start:]
    consumer = sum(len(cpos) * _dense_per_token(cfg) + _attention(cfg, cpos, start, cpos + 1)
                   for _ in range(cfg.n_producer, cfg.n_layers))
    boundary = 2.0 * prompt_len * cfg.hidden * cfg.head_dim
    logits = 2.0 * cfg.hidden * cfg.vocab_size
    return PrefillFlops(producer, boundary, consumer, logits)
