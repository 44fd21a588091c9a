"""Naive reference forward: no cache, recomputes everything. It defines the model's semantics.

Decoder-side bounded replay: with ``keep`` set, consumer layers run only on positions
``>= consumer_start = max(0, prompt_len - keep)``; their SWA branch sees no key before that
position, while the global KV still covers every token. Generated tokens (positions >=
prompt_len) run through every layer. The paged engine must match this function.
"""

from __future__ import annotations

import torch

from dsi.model.config import ModelConfig
from dsi.model.ops import attend, compress_pairs, moe, rms_norm, rope


def consumer_start(prompt_len: int, keep: int | None) -> int:
    return 0 if keep is None else max(0, prompt_len - keep)


@torch.no_grad()
def reference_logits(cfg: ModelConfig, w: dict[str, torch.Tensor], tokens: list[int], prompt_len: int,
                     keep: int | None, last_only: bool = False, from_pos: int = 0) -> torch.Tensor:
    """Logits [T, V] for every position >= max(consumer_start, from_pos) (earlier rows are NaN);
    [1, V] with ``last_only``."""
    t = len(tokens)
    pos = torch.arange(t)
    x = w["embed"][torch.tensor(tokens)]
    latents: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for i in range(cfg.n_producer):
        x = _layer(cfg, w, i, x, pos, 0, latents.get(cfg.source_of(i)) if i not in cfg.kv_sources else None,
                   latents, source=i in cfg.kv_sources)
    g = rms_norm(x, w["boundary.norm"], cfg.norm_eps) @ w["boundary.wg"]  # [T, D] ratio-1 global latents
    start = consumer_start(prompt_len, keep)
    xc, pc = x[start:], pos[start:]
    for i in range(cfg.n_producer, cfg.n_layers):
        xc = _layer(cfg, w, i, xc, pc, start, (g, pos), latents, source=False)
    if last_only:
        return rms_norm(xc[-1:], w["final_norm"], cfg.norm_eps) @ w["embed"].T
    out = torch.full((t, cfg.vocab_size), float("nan"))
    first = max(start, from_pos)
    out[first:] = rms_norm(xc[first - start:], w["final_norm"], cfg.norm_eps) @ w["embed"].T
    return out


def _layer(cfg: ModelConfig, w: dict[str, torch.Tensor], i: int, x: torch.Tensor, pos: torch.Tensor, swa_start: int,
           glob: tuple[torch.Tensor, torch.Tensor] | None, latents: dict, source: bool) -> torch.Tensor:
    p = f"layers.{i}."
    xn = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
    t = x.shape[0]
    q = (xn @ w[p + "wq"]).view(t, cfg.n_heads, cfg.head_dim)
    k = (xn @ w[p + "wk"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    v = (xn @ w[p + "wv"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    if source:  # compress complete pairs (2j, 2j+1); the latent covers up to position 2j+1
        pairs = t // 2
        lat = compress_pairs(xn[0:2 * pairs:2], xn[1:2 * pairs:2], w[p + "wc0"], w[p + "wc1"])
        latents[i] = (lat, torch.arange(pairs) * 2 + 1)
        glob = latents[i]
    q_rot, k_rot = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    lat, last = glob if glob is not None else (None, None)
    a = attend(q, q_rot, pos, k_rot, v, pos, swa_start, lat, last, cfg.window)
    x = x + a @ w[p + "wo"]
    return x + moe(rms_norm(x, w[p + "ffn_norm"], cfg.norm_eps), w, p, cfg)


@torch.no_grad()
def reference_generate(cfg: ModelConfig, w: dict[str, torch.Tensor], prompt: list[int], max_tokens: int,
                       keep: int | None) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy continuation by full recomputation; returns (tokens, last-position logits per step)."""
    tokens, out, logits = list(prompt), [], []
    for _ in range(max_tokens):
        row = reference_logits(cfg, w, tokens, len(prompt), keep, last_only=True)[0]
        logits.append(row)
        nxt = int(row.argmax())
        out.append(nxt)
        tokens.append(nxt)
    return out, logits
