"""FLOP count of a prefill and of one decode step, analytically, for any config (``flash`` included).

Counts 2 x multiply-adds of the useful work: projections, MoE (routed top-k + shared), and
attention over the keys each query really sees - SWA ``min(window, t + 1 - start)`` keys plus
the global entries visible at t (capped by the indexer's top-k where the config has one, plus
the indexer's own scoring over every visible entry). Logits only for the last position.

The sums over positions are taken in closed form (O(layers) per call, no arrays), so a balancer
can price every request it routes; no torch is needed to import this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dsi.model.config import ModelConfig
from dsi.model.hits import consumer_start, replay_start

if TYPE_CHECKING:
    from dsi.model.llama import LlamaConfig


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


def _window_sum(n: int, window: int) -> int:
    """sum of min(window, k) for k = 1..n (0 for n <= 0)."""
    if n <= window:
        return max(n, 0) * (max(n, 0) + 1) // 2
    return window * (window + 1) // 2 + (n - window) * window


def _pooled_sum(n: int, ratio: int) -> int:
    """sum of k // ratio for k = 1..n: the global entries visible to positions 0..n-1."""
    m, rem = divmod(max(n, 0), ratio)
    return ratio * m * (m - 1) // 2 + m * (rem + 1)


def _capped_sum(n: int, ratio: int, cap: int) -> int:
    """sum of min(k // ratio, cap) for k = 1..n (cap 0 = no cap)."""
    if not cap:
        return _pooled_sum(n, ratio)
    last = cap * ratio - 1  # the last k with k // ratio < cap
    return _pooled_sum(min(n, last), ratio) + cap * max(0, n - last)


def _attention(cfg: ModelConfig, first: int, end: int, swa_start: int, ratio: int) -> float:
    """Attention FLOPs of positions [first, end) of one layer; ``ratio``: global entries per token
    pooled (1 = ratio-1 global KV, 2 = compressed, 0 = the layer sees no global KV)."""
    keys = _window_sum(end - swa_start, cfg.window) - _window_sum(first - swa_start, cfg.window)
    index = 0.0
    if ratio:
        keys += _capped_sum(end, ratio, cfg.index_topk) - _capped_sum(first, ratio, cfg.index_topk)
        if cfg.index_dim:
            index = 2.0 * cfg.index_dim * (_pooled_sum(end, ratio) - _pooled_sum(first, ratio))
    return 4.0 * cfg.n_heads * cfg.head_dim * keys + index


def _llama_per_token(cfg: LlamaConfig) -> float:
    h, d = cfg.hidden, cfg.head_dim
    return 2.0 * (h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * d + 3 * h * cfg.intermediate)


def _llama_layers(cfg: LlamaConfig, first: int, end: int) -> float:
    """Every layer on positions [first, end): projections, MLP and causal attention (t + 1 keys)."""
    keys = end * (end + 1) // 2 - first * (first + 1) // 2
    return cfg.n_layers * ((end - first) * _llama_per_token(cfg) + 4.0 * cfg.n_heads * cfg.head_dim * keys)


def prefill_flops(
    cfg: ModelConfig | LlamaConfig, prompt_len: int, keep: int | None, hit: int = 0
) -> PrefillFlops:
    """FLOPs of one prefill of ``prompt_len`` tokens; ``hit``: tokens whose Block KV comes from the
    cache. With a hit the producer half runs from the replay start R (rebuilding the SWA rings of
    the window before the hit) and the boundary covers the same positions; the consumer half is
    unchanged (``dsi.model.reference`` defines both). A Llama-family model computes every layer
    from the hit on (counted as ``producer``)."""
    if not 0 <= hit < max(prompt_len, 1):
        raise ValueError(f"hit {hit} must be in [0, prompt_len) for a {prompt_len}-token prompt")
    if cfg.family == "llama":
        return PrefillFlops(_llama_layers(cfg, hit, prompt_len), 0.0, 0.0, 2.0 * cfg.hidden * cfg.vocab_size)
    start = consumer_start(prompt_len, keep)
    first = replay_start(hit, start, cfg.window)
    computed = prompt_len - first
    dense = _dense_per_token(cfg)
    producer = 0.0
    for layer in range(cfg.n_producer):
        ratio = cfg.compress_ratio if cfg.source_of(layer) is not None else 0
        producer += computed * dense + _attention(cfg, first, prompt_len, first, ratio)
        if layer in cfg.kv_sources:
            producer += 2.0 * computed * cfg.hidden * cfg.head_dim  # compressor
    consumer = sum(
        (prompt_len - start) * dense + _attention(cfg, start, prompt_len, start, 1)
        for _ in range(cfg.n_producer, cfg.n_layers)
    )
    boundary = 2.0 * computed * cfg.hidden * cfg.head_dim
    logits = 2.0 * cfg.hidden * cfg.vocab_size
    return PrefillFlops(producer, boundary, consumer, logits)


def decode_flops(cfg: ModelConfig | LlamaConfig, context: int) -> float:
    """FLOPs of decoding one token that follows ``context`` tokens (it sees ``context + 1``
    positions): every layer (generated tokens run through all of them), the boundary latent,
    the compressors, and the logits."""
    if cfg.family == "llama":
        return _llama_layers(cfg, context, context + 1) + 2.0 * cfg.hidden * cfg.vocab_size
    pos, end = context, context + 1
    dense = _dense_per_token(cfg)
    total = 0.0
    for layer in range(cfg.n_layers):
        if layer < cfg.n_producer:
            ratio = cfg.compress_ratio if cfg.source_of(layer) is not None else 0
        else:
            ratio = 1
        total += dense + _attention(cfg, pos, end, 0, ratio)
    total += 2.0 * cfg.hidden * cfg.head_dim * (len(cfg.kv_sources) + 1)  # compressors + boundary
    return total + 2.0 * cfg.hidden * cfg.vocab_size
