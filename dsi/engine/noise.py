"""A request's random stream: one Exp(1) variate per (seed, position, token id).

Sampling at a position is an exponential race over token ids (:func:`dsi.engine.sampler.race`).
The variate a race reads for id ``v`` at position ``p`` of a request with seed ``s`` is a pure
function of ``(s, p, v)``, computed by a counter-based generator rather than drawn from a
sequential one::

    (s, p)  --SplitMix64 (Python ints, exact)-->  keys k1, k2  (32 bits each)
    v       --fmix32(fmix32(v ^ k1) ^ k2)------>  h  (32 bits; fmix32: MurmurHash3's finaliser)
    h       --u = (h + 1/2) / 2^32,  E = -ln u-->  E(s, p, v)  (float64)

So a position reads the same variates whatever else shares the step, whether or not it was
drafted, and on whichever instance re-runs the request; and the draft, which scores only its
vocabulary ``[Vd]``, reads at those ids exactly the variates the target reads over the whole
vocabulary ``[V]``, which couples the draft's draw to the target's (see
:mod:`dsi.engine.spec_verify`). The hashing is numpy uint32 arithmetic (products wrap modulo
2^32 by definition), several times faster than the same in torch's int64 over a [V] row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF


def keys(seed: int, position: int) -> tuple[int, int]:
    """The two 32-bit keys of a request's draws at ``position`` (SplitMix64 of seed, then position)."""
    z = _splitmix(_splitmix(seed & _M64) ^ (position & _M64))
    return z & _M32, z >> 32


def exponentials(seeds: Sequence[int], positions: Sequence[int], ids: torch.Tensor | int) -> torch.Tensor:
    """Exp(1) variates ``[R, n]`` float64: row r holds those of token ids ``ids`` (``[n]`` int64,
    0 <= id < 2^32; an int n: ids 0 .. n - 1) at ``positions[r]`` of the request seeded ``seeds[r]``."""
    k = np.array([keys(s, p) for s, p in zip(seeds, positions, strict=True)], dtype=np.uint32)
    v = np.arange(ids, dtype=np.uint32) if isinstance(ids, int) else ids.numpy().astype(np.uint32)
    h = _fmix32(v[None, :] ^ k[:, :1])
    h ^= k[:, 1:]
    u = _fmix32(h).astype(np.float64)
    u += 0.5
    u *= 2.0**-32
    return torch.from_numpy(np.negative(np.log(u, out=u), out=u))


def _splitmix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _fmix32(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 32-bit finaliser, elementwise over uint32 (in place)."""
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h
