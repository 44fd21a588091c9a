"""Naive Gemma 3 forward: no cache, recomputes everything. It defines the family's semantics,
with and without a prefix hit; the paged engine (:mod:`dsi.engine.runner_gemma3`) must match it.

Prefix hit of H tokens (a multiple of block_size, leaving the last prompt token to compute):
the global layers' K/V of positions < H come from the cache, i.e. from a cold computation of
``tokens[:H]`` alone. Without the SWA rings at H (bounded replay) every layer is recomputed on
positions >= R = max(0, H - window), the sliding layers seeing no key before R; the replay's own
global K/V of positions < H are discarded for the cached ones::

    position     0 ............ R ............ H ............ T
    global K/V   cached (cold) ................ | computed here
    all layers   not run        | run; sliding keys from R on ...

Positions [R, R + window - 1) see cut windows, so their hidden states differ from the cold
ones, and that difference reaches positions >= H through the sliding keys of [R, H) and the
global K/V the layers compute from them: the output is in general not the hit-free one. With
the rings at H (an exact hit, the keys of [H - window, H) of every sliding layer) nothing is
replayed and the output is that of ``hit = 0``; this function has no separate path for it.
"""

from __future__ import annotations

import torch

from dsi.model.gemma3 import Gemma3Config, embed, finish_layer, logits_of, qkv
from dsi.model.hits import max_hit, replay_start
from dsi.model.ops import attend

GlobalKV = dict[int, tuple[torch.Tensor, torch.Tensor]]  # global layer -> (K [P, Hkv, D], V [P, Hkv, D])


@torch.no_grad()
def gemma3_logits(
    cfg: Gemma3Config,
    w: dict[str, torch.Tensor],
    tokens: list[int],
    prompt_len: int | None = None,
    hit: int = 0,
    from_pos: int | None = None,
) -> torch.Tensor:
    """Logits [T - from_pos, V] of positions from_pos .. T - 1 (default: the last position only).
    ``hit``: prefix hit length H (see the module docstring); ``prompt_len`` (default all tokens)
    bounds it; ``from_pos`` must be >= R."""
    t = len(tokens)
    prompt_len = t if prompt_len is None else prompt_len
    if hit < 0 or hit % cfg.block_size or hit > max_hit(prompt_len, cfg.block_size):
        raise ValueError(f"hit {hit} must be a multiple of {cfg.block_size} leaving the last prompt token")
    first = replay_start(hit, prompt_len, cfg.window)
    from_pos = t - 1 if from_pos is None else from_pos
    if from_pos < first:
        raise ValueError(f"positions before R = {first} are not computed with a hit of {hit}")
    cached = _forward(cfg, w, tokens[:hit], 0, {})[1] if hit else {}
    x, _ = _forward(cfg, w, tokens, first, cached)
    return logits_of(cfg, w, x[from_pos - first :])


def _forward(
    cfg: Gemma3Config, w: dict[str, torch.Tensor], tokens: list[int], first: int, cached: GlobalKV
) -> tuple[torch.Tensor, GlobalKV]:
    """Every layer on positions [first, T), sliding keys from ``first``; the global K/V of the
    positions ``cached`` covers are taken from it. Returns (hidden [T - first, H], global K/V of
    positions [0, T))."""
    pos = torch.arange(first, len(tokens))
    x = embed(cfg, w, torch.tensor(tokens[first:], dtype=torch.long))
    kv: GlobalKV = {}
    for i in range(cfg.n_layers):
        q, k, v = qkv(cfg, w, i, x, pos)
        if cfg.sliding[i]:
            out = attend(q, q, pos, k, v, pos, first, None, None, cfg.window)
        else:
            if i in cached:
                ck, cv = cached[i]
                k, v = torch.cat([ck, k[ck.shape[0] - first :]]), torch.cat([cv, v[cv.shape[0] - first :]])
            elif first:
                raise ValueError("a forward from R > 0 needs the cached global K/V")
            kv[i] = (k, v)
            out = attend(q, q, pos, k, v, torch.arange(k.shape[0]), 0, None, None, len(tokens) + 1)
        x = finish_layer(cfg, w, i, x, out)
    return x, kv


@torch.no_grad()
def gemma3_generate(
    cfg: Gemma3Config, w: dict[str, torch.Tensor], prompt: list[int], max_tokens: int, hit: int = 0
) -> list[int]:
    """Greedy continuation by full recomputation, with the semantics of a prefix hit of ``hit``."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        nxt = int(gemma3_logits(cfg, w, tokens, len(prompt), hit)[-1].argmax())
        out.append(nxt)
        tokens.append(nxt)
    return out
