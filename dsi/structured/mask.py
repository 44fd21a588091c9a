"""Packed token bitmasks, as llguidance and xgrammar write them.

Layout: ``bitmask [..., ceil(V / 32)] int32``; token ``t`` is allowed when bit ``t % 32`` of word
``t // 32`` is set (little-endian bit order within the word)::

    word 0: bit 0 = token 0, bit 1 = token 1 (EOS), ... bit 31 = token 31
    word 1: bit 0 = token 32, ...
"""

from __future__ import annotations

import torch

_SHIFTS = torch.arange(32, dtype=torch.int32)


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """``bitmask [..., words] int32`` -> ``allowed [..., vocab_size] bool``."""
    bits = (bitmask.unsqueeze(-1) >> _SHIFTS) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """Set disallowed logits to ``-inf`` in place. ``logits [..., V]``, ``bitmask [..., words]``."""
    allowed = unpack_bitmask(bitmask, logits.shape[-1])
    return logits.masked_fill_(~allowed, float("-inf"))
