"""Decode balancer: request count and KV tokens against capacity, long and short KV-length bands.

Score of instance i for a request of k KV tokens (its context at handoff), after placement::

    score = max((running_i + 1) / max_requests_i, (kv_tokens_i + k) / kv_capacity_tokens_i)

*Eligible*: serving (not draining) and not full (the request fits in both limits). *Overloaded*:
holding >= 2 requests with score > ``overload``; one request alone never makes an instance
overloaded (no balancer can split it).

Bands (:func:`plan_bands`), from the KV lengths of the last ``window`` routed requests:

1. Threshold: the split of the sorted lengths into two groups that maximises the between-group
   variance of log2(length) (Otsu's rule), raised to ``long_min_tokens``. A request with
   k >= threshold is long. No split (one band) with fewer than ``min_samples`` requests, or
   when the long group's geometric mean is under ``band_ratio`` times the short group's.
2. Count: the long band's share of the load, share = sum over long requests of
   (k + ``request_kv_tokens``) / the same sum over all; with ``request_kv_tokens = 0`` that is
   its share of the KV load. The long band gets n_long = min(N - 1, floor(N * share + 1/2)) of
   the N serving instances, the short band the rest; n_long = 0 means one band.
3. Hysteresis: n_long is redone only when the serving set changes, a split appears or goes, or
   share differs from the share it was made from by more than ``hysteresis``. The threshold
   itself follows the mix at every request.
4. Membership: long instances stay long; more are taken (or dropped) by the highest (lowest)
   mean KV tokens per running request, ties by id.

Routing (:func:`choose`): the eligible instance of the request's band with the lowest score
(ties: fewer requests, then id). A *colocated* request (no prefill instance: the decode computes
its prompt itself) goes first to the instance with the fewest prompt tokens queued for computing
(``queued_tokens``), then by score: its first token waits for that queue, which requests and KV
against capacity do not show (two colocated vLLM decodes routed by score alone sent requests
behind 2,000-4,600 queued tokens while the other instance had none). If the pick would be
overloaded after placement, or the band has no eligible instance, the request goes to the
eligible instance of any band that would not be overloaded, lowest score first; only when every
eligible instance would be overloaded does it go to the lowest score. Hence the guarantee the tests check: a placement never leaves an
instance overloaded while another eligible instance is idle.

Worked example (4 instances of 64 requests / 1M KV tokens; 40 requests of 1,000 tokens and 8
of 20,000)::

    >>> b = DecodeBalancer(DecodeBalancerConfig())
    >>> pool = [InstanceLoad(id=f"d{i}", role="decode", max_requests=64, kv_capacity_tokens=1_000_000)
    ...         for i in range(4)]
    >>> for k in [1_000] * 40 + [20_000] * 8:
    ...     d = b.route(k, pool)
    >>> d
    DecodeDecision(instance='d0', band='long', spilled=False, score=0.02)
    >>> b.bands.threshold, b.bands.long, round(b.bands.share, 3)
    (20000, ('d0', 'd1', 'd2'), 0.778)
    >>> b.route(1_000, pool)
    DecodeDecision(instance='d3', band='short', spilled=False, score=0.015625)

The long band grew with its KV share (1 instance at the first long request, share 0.33; 2 at
0.5; 3 at 0.67; at 0.8 the share has moved only 0.02 since 0.778, so the count stays).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from dsi.balance.load import InstanceLoad, NoInstance, serving


@dataclass(slots=True, frozen=True)
class DecodeBalancerConfig:
    window: int = 256  # recent requests whose KV lengths set the bands
    min_samples: int = 16  # fewer recent requests than this: one band
    long_min_tokens: int = 8_192  # a request shorter than this is never long, KV tokens
    band_ratio: float = 4.0  # split only if the long group's geometric mean length is >= this x the short's
    request_kv_tokens: int = 0  # KV tokens one request weighs in a band's load (0 = KV load only)
    hysteresis: float = 0.1  # the long band's share must move more than this (of 1) to change n_long
    overload: float = 0.9  # score above which an instance with >= 2 requests is overloaded

    def __post_init__(self) -> None:
        problems = []
        if self.window < 1 or not 1 <= self.min_samples <= self.window:
            problems.append("window must be >= 1 and min_samples in [1, window]")
        if self.long_min_tokens < 1 or self.band_ratio < 1 or self.request_kv_tokens < 0:
            problems.append("long_min_tokens must be >= 1, band_ratio >= 1, request_kv_tokens >= 0")
        if not 0 <= self.hysteresis < 1 or not 0 < self.overload <= 1:
            problems.append("hysteresis must be in [0, 1) and overload in (0, 1]")
        if problems:
            raise ValueError("decode balancer config: " + "; ".join(problems))


@dataclass(slots=True, frozen=True)
class DecodeBands:
    threshold: int | None  # KV tokens where long starts; None = one band
    long: tuple[str, ...]  # instances of the long band (empty: one band)
    share: float  # the long band's load share n_long was made from (0..1)


@dataclass(slots=True, frozen=True)
class DecodeDecision:
    instance: str
    band: Literal["long", "short", "one"]  # the request's band ("one": no split)
    spilled: bool  # placed outside its band to avoid an overload
    score: float  # the instance's score after placement (0..1)


def long_threshold(kv_lengths: Sequence[int], cfg: DecodeBalancerConfig) -> int | None:
    """Step 1: the KV length where the long band starts, or None for one band."""
    if len(kv_lengths) < cfg.min_samples:
        return None
    xs = sorted(kv_lengths)
    logs = [math.log2(max(x, 1)) for x in xs]
    total, left, best, cut = sum(logs), 0.0, 0.0, 0
    for i in range(1, len(xs)):
        left += logs[i - 1]
        if xs[i] == xs[i - 1]:
            continue
        w = i / len(xs)
        between = w * (1 - w) * (left / i - (total - left) / (len(xs) - i)) ** 2
        if between > best:
            best, cut = between, i
    if not cut:
        return None
    threshold = max(xs[cut], cfg.long_min_tokens)
    long = [v for x, v in zip(xs, logs, strict=True) if x >= threshold]
    short = logs[: len(logs) - len(long)]
    if not long or not short or sum(long) / len(long) - sum(short) / len(short) < math.log2(cfg.band_ratio):
        return None
    return threshold


def plan_bands(
    kv_lengths: Sequence[int],
    instances: Sequence[InstanceLoad],
    previous: DecodeBands | None,
    cfg: DecodeBalancerConfig,
) -> DecodeBands:
    """Steps 1-4 over the serving decode ``instances``."""
    threshold = long_threshold(kv_lengths, cfg)
    if threshold is None or len(instances) < 2:
        return DecodeBands(None, (), 0.0)
    weight = sum(k + cfg.request_kv_tokens for k in kv_lengths)
    share = sum(k + cfg.request_kv_tokens for k in kv_lengths if k >= threshold) / weight
    ids = {i.id for i in instances}
    if (
        previous is not None
        and previous.threshold is not None
        and set(previous.long) <= ids
        and abs(share - previous.share) <= cfg.hysteresis
    ):
        return DecodeBands(threshold, previous.long, previous.share)
    count = min(len(instances) - 1, math.floor(len(instances) * share + 0.5))
    kept = set(previous.long) & ids if previous is not None else set()
    ranked = sorted(
        instances, key=lambda i: (i.id not in kept, -i.kv_tokens / max(i.running_requests, 1), i.id)
    )
    return DecodeBands(threshold, tuple(sorted(i.id for i in ranked[:count])), share)


def score_after(instance: InstanceLoad, kv_tokens: int) -> float:
    return max(
        (instance.running_requests + 1) / instance.max_requests,
        (instance.kv_tokens + kv_tokens) / instance.kv_capacity_tokens,
    )


def fits(instance: InstanceLoad, kv_tokens: int) -> bool:
    return (
        instance.running_requests < instance.max_requests
        and instance.kv_tokens + kv_tokens <= instance.kv_capacity_tokens
    )


def overloaded_after(instance: InstanceLoad, kv_tokens: int, cfg: DecodeBalancerConfig) -> bool:
    return instance.running_requests >= 1 and score_after(instance, kv_tokens) > cfg.overload


def choose(
    kv_tokens: int,
    instances: Sequence[InstanceLoad],
    bands: DecodeBands,
    cfg: DecodeBalancerConfig,
    colocated: bool = False,
) -> DecodeDecision:
    """The instance for a request of ``kv_tokens`` (routing rule of the module docstring);
    ``colocated``: the decode computes the request's prompt (fewest queued prompt tokens first)."""
    eligible = [i for i in serving(instances, "decode") if fits(i, kv_tokens)]
    if not eligible:
        raise NoInstance(f"no serving decode instance has room for {kv_tokens} KV tokens")
    long = set(bands.long)
    band: Literal["long", "short", "one"] = "one"
    if long:
        band = "long" if bands.threshold is not None and kv_tokens >= bands.threshold else "short"
    home = [i for i in eligible if (i.id in long) == (band == "long")] if long else eligible

    def rank(i: InstanceLoad) -> tuple[int, float, int, str]:
        return i.queued_tokens if colocated else 0, score_after(i, kv_tokens), i.running_requests, i.id

    best = min(home, key=rank) if home else None
    if best is None or overloaded_after(best, kv_tokens, cfg):
        best = min(eligible, key=lambda i: (overloaded_after(i, kv_tokens, cfg), *rank(i)))
    spilled = bool(long) and (best.id in long) != (band == "long")
    return DecodeDecision(best.id, band, spilled, round(score_after(best, kv_tokens), 6))


class DecodeBalancer:
    """The band policy over time: the recent KV lengths and the bands. No I/O; the caller passes a
    fresh snapshot with each request."""

    def __init__(self, cfg: DecodeBalancerConfig) -> None:
        self.cfg = cfg
        self._recent: deque[int] = deque(maxlen=cfg.window)
        self.bands = DecodeBands(None, (), 0.0)

    def route(
        self, kv_tokens: int, instances: Sequence[InstanceLoad], colocated: bool = False
    ) -> DecodeDecision:
        """The instance for a request that arrives holding ``kv_tokens`` (>= 1) of context
        (``colocated``: as :func:`choose` says)."""
        if kv_tokens < 1:
            raise ValueError(f"a decode request holds >= 1 KV token, not {kv_tokens}")
        pool = serving(instances, "decode")
        self._recent.append(kv_tokens)
        self.bands = plan_bands(list(self._recent), pool, self.bands, self.cfg)
        return choose(kv_tokens, pool, self.bands, self.cfg, colocated)

    def observe(self, kv_tokens: int) -> None:
        """Measure a request routed elsewhere (from a decision table): its KV length joins the
        recent ones the bands are made from."""
        self._recent.append(max(1, kv_tokens))

    def plan_for(self, instances: Sequence[InstanceLoad]) -> DecodeBands:
        """The bands to route by now over ``instances`` (redone as :meth:`route` does)."""
        self.bands = plan_bands(list(self._recent), serving(instances, "decode"), self.bands, self.cfg)
        return self.bands
