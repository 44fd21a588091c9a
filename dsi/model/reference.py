"""Naive reference forward: no cache, recomputes everything. It defines the model's semantics.

Decoder-side bounded replay: with ``keep`` set, consumer layers run only on positions
``>= consumer_start = max(0, prompt_len - keep)``; their SWA branch sees no key before that
position, while the global KV still covers every token. Generated tokens (positions >=
prompt_len) run through every layer. The paged engine must match this function.

Prefix hit with encoder-side bounded replay (``hit = H > 0``, a multiple of ``block_size`` with
``H <= (prompt_len - 1) // block_size * block_size``): the Block KV of positions ``< H`` (the
producer sources' ratio-2 latents and the ratio-1 global latents) comes from the cache, i.e.
from a cold computation of ``tokens[:H]`` alone (what an earlier hit-free run of the same prefix
wrote). SWA rings are not cached, so the producer layers are recomputed on positions
``>= R = max(0, min(H - window, consumer_start))``, with their SWA branch seeing no key before
``R``::

    position     0 ............ R ............ H ............ T
    latents      cached (cold) ................ | computed here
    producer     not run        | run, SWA keys from R on ......
    consumer     positions >= consumer_start (>= R), as without a hit

The replay's own latents for positions < H are discarded: the cached ones are used as they
are. Outputs with a hit are defined by this function and are in general not bit-identical to
a hit-free run: the producer hidden states of positions [R, R + window - 1) differ from the
cold ones (their SWA windows are cut at R), and that difference reaches positions >= H through
SWA keys and the latents computed from them. With ``R = 0`` a hit changes nothing but fp32
rounding (the cached prefix was computed in a separate pass).

Exact hit: when the host that computed the boundary H still holds the producer SWA keys/values
of positions ``[H - 128, H)`` (a ring snapshot), loading them makes a hit exact: nothing is
replayed and the output is that of ``hit = 0`` (up to fp32 rounding). It needs
``H <= consumer_start`` (consumer rows below H would need producer hidden states that are not
cached); :func:`exact_hit_limit` gives the largest such H.
"""

from __future__ import annotations

import torch

from dsi.model.config import ModelConfig
from dsi.model.hits import consumer_start, max_hit, replay_start
from dsi.model.hits import exact_hit_limit as exact_hit_limit  # re-exported
from dsi.model.ops import attend, compress_pairs, moe, rms_norm, rope

Latents = dict[int, tuple[torch.Tensor, torch.Tensor]]  # source layer -> ([P, D] latents, [P] last position)


@torch.no_grad()
def reference_logits(
    cfg: ModelConfig,
    w: dict[str, torch.Tensor],
    tokens: list[int],
    prompt_len: int,
    keep: int | None,
    last_only: bool = False,
    from_pos: int = 0,
    hit: int = 0,
) -> torch.Tensor:
    """Logits [T, V] for every position >= max(consumer_start, from_pos) (earlier rows are NaN);
    [1, V] with ``last_only``. ``hit``: prefix hit length in tokens (see the module docstring)."""
    if hit < 0 or hit % cfg.block_size or hit > max_hit(prompt_len, cfg.block_size):
        raise ValueError(f"hit {hit} must be a multiple of {cfg.block_size} leaving the last prompt token")
    t = len(tokens)
    pos = torch.arange(t)
    start = consumer_start(prompt_len, keep)
    first = replay_start(hit, start, cfg.window)
    cached = _producer(cfg, w, tokens[:hit], 0, None, 0)[1:] if hit else None
    x, _, g = _producer(cfg, w, tokens, first, cached, hit)
    xc, pc = x[start - first :], pos[start:]
    for i in range(cfg.n_producer, cfg.n_layers):
        xc, _ = _layer(cfg, w, i, xc, pc, start, (g, pos), None)
    if last_only:
        return rms_norm(xc[-1:], w["final_norm"], cfg.norm_eps) @ w["embed"].T
    out = torch.full((t, cfg.vocab_size), float("nan"))
    row = max(start, from_pos)
    out[row:] = rms_norm(xc[row - start :], w["final_norm"], cfg.norm_eps) @ w["embed"].T
    return out


def _producer(
    cfg: ModelConfig,
    w: dict[str, torch.Tensor],
    tokens: list[int],
    first: int,
    cached: tuple[Latents, torch.Tensor] | None,
    hit: int,
) -> tuple[torch.Tensor, Latents, torch.Tensor]:
    """Producer half on positions [first, T), SWA starting at ``first``; latents of positions
    < ``hit`` come from ``cached`` (source latents, global latents [hit, D]).
    Returns (hidden [T - first, H], source latents of every pair, global latents [T, D])."""
    pos = torch.arange(first, len(tokens))
    x = w["embed"][torch.tensor(tokens[first:], dtype=torch.long)]
    latents: Latents = {}
    for i in range(cfg.n_producer):
        if i in cfg.kv_sources:
            prior = cached[0][i][0] if cached else None
            x, latents[i] = _layer(cfg, w, i, x, pos, first, None, (prior, hit - first))
        else:
            x, _ = _layer(cfg, w, i, x, pos, first, latents.get(cfg.source_of(i)), None)
    g = rms_norm(x, w["boundary.norm"], cfg.norm_eps) @ w["boundary.wg"]  # ratio-1 global latents
    if cached is not None:
        g = torch.cat([cached[1], g[hit - first :]])
    return x, latents, g


def _layer(
    cfg: ModelConfig,
    w: dict[str, torch.Tensor],
    i: int,
    x: torch.Tensor,
    pos: torch.Tensor,
    swa_start: int,
    glob: tuple[torch.Tensor, torch.Tensor] | None,
    source: tuple[torch.Tensor | None, int] | None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
    """One layer. ``source`` = (cached latents [P0, D] or None, row of the first pair to compress)
    makes it a KV-source layer: it attends to (cached + its own) latents and returns them."""
    p = f"layers.{i}."
    xn = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
    t = x.shape[0]
    q = (xn @ w[p + "wq"]).view(t, cfg.n_heads, cfg.head_dim)
    k = (xn @ w[p + "wk"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    v = (xn @ w[p + "wv"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    if source is not None:  # compress complete pairs (2j, 2j+1); the latent covers up to position 2j+1
        prior, o = source
        pairs = (t - o) // 2
        lat = compress_pairs(
            xn[o : o + 2 * pairs : 2], xn[o + 1 : o + 2 * pairs : 2], w[p + "wc0"], w[p + "wc1"]
        )
        if prior is not None:
            lat = torch.cat([prior, lat])
        glob = (lat, torch.arange(lat.shape[0]) * 2 + 1)
    q_rot, k_rot = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
    lat, last = glob if glob is not None else (None, None)
    a = attend(q, q_rot, pos, k_rot, v, pos, swa_start, lat, last, cfg.window)
    x = x + a @ w[p + "wo"]
    return x + moe(rms_norm(x, w[p + "ffn_norm"], cfg.norm_eps), w, p, cfg), (
        glob if source is not None else None
    )


@torch.no_grad()
def reference_generate(
    cfg: ModelConfig,
    w: dict[str, torch.Tensor],
    prompt: list[int],
    max_tokens: int,
    keep: int | None,
    hit: int = 0,
    frequency_penalty: float = 0.0,
    presence_penalty: float = 0.0,
) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy continuation by full recomputation; returns (tokens, per step the last-position
    logits the token was chosen from). ``hit``: prefix hit length (see the module docstring).
    Penalties (OpenAI's): before each choice, id t loses ``frequency_penalty * n + presence_penalty``
    where n > 0 is its count in the output so far (the prompt does not count)."""
    tokens, out, logits = list(prompt), [], []
    counts = torch.zeros(cfg.vocab_size)
    for _ in range(max_tokens):
        row = reference_logits(cfg, w, tokens, len(prompt), keep, last_only=True, hit=hit)[0]
        if frequency_penalty or presence_penalty:
            row = row - (frequency_penalty * counts + presence_penalty * (counts > 0).to(counts.dtype))
        logits.append(row)
        nxt = int(row.argmax())
        out.append(nxt)
        tokens.append(nxt)
        counts[nxt] += 1
    return out, logits
