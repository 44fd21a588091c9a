"""The balancer role's routing: the dsi.balance policies over a LoadTable snapshot, plus the two
things a role adds to them - a request's ``exclude`` list and the status view.

``exclude`` (instances that already failed the request) never changes a plan: the policy routes
over every serving instance, and when it picks an excluded one the request goes to the least
loaded other instance of the same bucket (prefill) or by the same band rule (decode), else to
any other serving instance. So a failover retry does not reshuffle the buckets.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from dsi.balance import (
    DecodeBalancer,
    DecodeBalancerConfig,
    InstanceLoad,
    NoInstance,
    PrefillBalancer,
    PrefillBalancerConfig,
    PrefillCost,
)
from dsi.balance.decode import choose
from dsi.balance.load import serving
from dsi.config import BalancerOptions
from dsi.messages.balancer import BucketInfo
from dsi.model.config import ModelConfig

MIN_BAND_SAMPLES = 16  # recent decode requests before the bands may split


@dataclass(slots=True, frozen=True)
class Choice:
    instance: str
    bucket: int = -1
    band: str = ""


def prefill_config(options: BalancerOptions) -> PrefillBalancerConfig:
    return PrefillBalancerConfig(
        edges=options.bucket_edges,
        rebalance_s=options.rebalance_s,
        half_life_s=options.half_life_s,
        hysteresis=options.bucket_hysteresis,
        min_share=options.min_share,
    )


def decode_config(options: BalancerOptions) -> DecodeBalancerConfig:
    return DecodeBalancerConfig(
        window=options.band_window,
        min_samples=min(MIN_BAND_SAMPLES, options.band_window),
        long_min_tokens=options.long_min_tokens,
        hysteresis=options.band_hysteresis,
        overload=options.overload,
    )


class Policies:
    """Prefill buckets and decode bands of one balancer; ``model`` prices a prefill in FLOPs."""

    def __init__(self, options: BalancerOptions, model: ModelConfig) -> None:
        self.prefill = PrefillBalancer(prefill_config(options), PrefillCost(model))
        self.decode = DecodeBalancer(decode_config(options))

    def route_prefill(
        self, uncached: int, cached: int, pool: Sequence[InstanceLoad], exclude: Collection[str], now: float
    ) -> Choice:
        """``uncached`` >= 1 tokens to compute after ``cached`` ones; ``now`` monotonic seconds."""
        decision = self.prefill.route(uncached, cached, pool, now)
        instance = decision.instance
        if instance in exclude:
            others = [e for e in serving(pool, "prefill") if e.id not in exclude]
            assert self.prefill.plan is not None
            home = set(self.prefill.plan.engines_for(decision.bucket))
            instance = _least(others, home, lambda e: (e.queued_tokens, e.running_requests, e.id), "prefill")
        return Choice(instance, bucket=decision.bucket)

    def route_decode(
        self, kv_tokens: int, pool: Sequence[InstanceLoad], exclude: Collection[str], colocated: bool = False
    ) -> Choice:
        """A request holding ``kv_tokens`` >= 1 tokens of context (``colocated``: the decode
        computes its prompt, see dsi.balance.decode.choose)."""
        decision = self.decode.route(kv_tokens, pool, colocated)
        if decision.instance in exclude:
            others = [i for i in pool if i.id not in exclude]
            decision = choose(kv_tokens, others, self.decode.bands, self.decode.cfg, colocated)
        return Choice(decision.instance, band=decision.band)

    def buckets(self, pool: Sequence[InstanceLoad], now: float) -> list[BucketInfo]:
        """Which prefill serves which bucket now (every serving one for each until a plan exists)."""
        cfg = self.prefill.cfg
        shares = self.prefill.shares(now)
        engines = serving(pool, "prefill")
        queued = {e.id: e.queued_tokens for e in engines}
        plan = self.prefill.plan
        out = []
        for b in range(cfg.buckets):
            ids = list(plan.engines_for(b)) if plan is not None else [e.id for e in engines]
            out.append(
                BucketInfo(
                    b,
                    cfg.edges[b - 1] if b else 0,
                    cfg.edges[b] if b < len(cfg.edges) else 0,
                    round(shares[b], 4),
                    ids,
                    sum(queued.get(i, 0) for i in ids),
                )
            )
        return out


def spread(pool: Sequence[InstanceLoad], role: str) -> float:
    """max / mean load over the serving instances of ``role`` (1.0 when even or idle). Prefill load
    is queued un-cached tokens; decode load is the score (requests or KV against capacity)."""
    loads = [
        e.queued_tokens
        if role == "prefill"
        else max(e.running_requests / e.max_requests, e.kv_tokens / e.kv_capacity_tokens)
        for e in serving(pool, role)
    ]  # type: ignore[arg-type]
    mean = sum(loads) / len(loads) if loads else 0.0
    return round(max(loads) / mean, 4) if mean > 0 else 1.0


def _least(pool: list[InstanceLoad], home: set[str], key, role: str) -> str:
    candidates = [e for e in pool if e.id in home] or pool
    if not candidates:
        raise NoInstance(f"no other serving {role} instance")
    return min(candidates, key=key).id
