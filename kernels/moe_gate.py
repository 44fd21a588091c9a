"""The fused MoE gate: router product, softmax over the experts and top-k, in one pass per token.

    x [T, H] (normalised hidden; rows contiguous)    router [H, E]
    -> top_w [T, k] fp32: the k largest softmax probabilities, renormalised to sum to 1
       top_i [T, k] int64: their experts, largest first (on a tie, the lower expert first)

what ``dsi.model.ops.route`` computes. :func:`moe_gate` is the Triton kernel (one program per
token; the k picks are k passes of max / argmax over the token's E probabilities held in
registers, so E is limited to ``MAX_EXPERTS``); :func:`moe_gate_reference` is the torch
definition.
"""

from __future__ import annotations

import torch

from dsi.kernels.triton_lang import jit, next_pow2, require, tl

BLOCK_H = 32
MAX_EXPERTS = 1024


@jit
def _moe_gate_kernel(
    x_ptr, s_x, router_ptr, s_r, w_ptr, i_ptr, H, E,
    K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_E: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK_E)
    em = e < E
    logits = tl.zeros([BLOCK_E], tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + tl.arange(0, BLOCK_H)
        hm = hh < H
        x = tl.load(x_ptr + t * s_x + hh, mask=hm, other=0.0).to(tl.float32)
        r = tl.load(router_ptr + hh[:, None] * s_r + e[None, :], mask=hm[:, None] & em[None, :], other=0.0)
        logits += tl.sum(x[:, None] * r.to(tl.float32), axis=0)
    logits = tl.where(em, logits, float("-inf"))
    p = tl.exp(logits - tl.max(logits, axis=0))
    p = tl.where(em, p / tl.sum(p, axis=0), -1.0)
    kk = tl.arange(0, BLOCK_K)
    chosen_w = tl.zeros([BLOCK_K], tl.float32)
    chosen_i = tl.zeros([BLOCK_K], tl.int64)
    for j in tl.static_range(K):
        best = tl.max(p, axis=0)
        at = tl.min(tl.where(p == best, e, BLOCK_E), axis=0)
        chosen_w = tl.where(kk == j, best, chosen_w)
        chosen_i = tl.where(kk == j, at.to(tl.int64), chosen_i)
        p = tl.where(e == at, -1.0, p)
    total = tl.sum(chosen_w, axis=0)
    tl.store(w_ptr + t * K + kk, chosen_w / total, mask=kk < K)
    tl.store(i_ptr + t * K + kk, chosen_i, mask=kk < K)


def _check(x: torch.Tensor, router: torch.Tensor, top_k: int) -> None:
    if x.dim() != 2 or router.dim() != 2 or router.shape[0] != x.shape[1] or x.stride(1) != 1:
        raise ValueError("x must be [T, H] (rows contiguous) and router [H, E]")
    if not 1 <= top_k <= router.shape[1]:
        raise ValueError(f"top_k must be in 1 .. {router.shape[1]} (the experts), not {top_k}")


def moe_gate(x: torch.Tensor, router: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel: (top_w [T, k] fp32, top_i [T, k] int64)."""
    _check(x, router, top_k)
    require(x, "moe_gate")
    t, h = x.shape
    e = router.shape[1]
    if e > MAX_EXPERTS:
        raise ValueError(f"moe_gate holds at most {MAX_EXPERTS} experts in registers, not {e}")
    router = router.contiguous()
    top_w = torch.empty(t, top_k, dtype=torch.float32, device=x.device)
    top_i = torch.empty(t, top_k, dtype=torch.long, device=x.device)
    if t:
        _moe_gate_kernel[(t,)](
            x, x.stride(0), router, router.stride(0), top_w, top_i, h, e,
            K=top_k, BLOCK_K=next_pow2(top_k), BLOCK_H=min(BLOCK_H, next_pow2(h)), BLOCK_E=next_pow2(e),
        )  # fmt: skip
    return top_w, top_i


def moe_gate_reference(
    x: torch.Tensor, router: torch.Tensor, top_k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch definition of :func:`moe_gate` (``dsi.model.ops.route`` with a plain product)."""
    _check(x, router, top_k)
    probs = torch.softmax(x.float() @ router.float(), dim=-1)
    top_w, top_i = probs.topk(top_k, dim=-1)
    return top_w / top_w.sum(-1, keepdim=True), top_i
