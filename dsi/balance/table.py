"""Decision table: a balancer's plan and loads at one moment, routed from by someone else.

A balancer makes a :class:`DecisionTable` from its policies (the prefill bucket plan, the decode
bands) and its load snapshot; a router holding the table routes each request with the same rules
as the policies, over the table's loads plus its own :class:`InFlight` additions since the
table was made (so a burst between two tables spreads instead of landing on one instance):

    prefill  the request's bucket (``edges``, as PrefillBalancerConfig.bucket_of); among the
             bucket's engines not excluded, the least queued (prefill.least_queued); no such
             engine: the least queued other serving engine
    decode   dsi.balance.decode.choose over the serving instances not excluded, with the table's
             bands and overload bound (a colocated request: fewest queued prompt tokens first)

Only serving instances are in a table (draining ones take nothing new); full decodes are
skipped by ``choose``. Units: tokens and requests. No I/O and no clock.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field

from dsi.balance.decode import DecodeBalancerConfig, DecodeBands, DecodeDecision, choose
from dsi.balance.load import InstanceLoad, NoInstance
from dsi.balance.prefill import least_queued


@dataclass(slots=True, frozen=True)
class DecisionTable:
    edges: tuple[int, ...]  # un-cached tokens where buckets 1.. start
    buckets: tuple[tuple[str, ...], ...]  # [bucket] prefill ids that serve it
    prefills: tuple[InstanceLoad, ...]  # serving prefills, by id
    decodes: tuple[InstanceLoad, ...]  # serving decodes, by id
    bands: DecodeBands = field(default_factory=lambda: DecodeBands(None, (), 0.0))
    overload: float = 0.9  # DecodeBalancerConfig.overload
    decode_cfg: DecodeBalancerConfig = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.buckets) != len(self.edges) + 1:
            raise ValueError(f"a table of {len(self.edges)} edges needs {len(self.edges) + 1} buckets")
        object.__setattr__(self, "decode_cfg", DecodeBalancerConfig(overload=self.overload))

    def bucket_of(self, uncached: int) -> int:
        return bisect.bisect_right(self.edges, uncached)


@dataclass(slots=True)
class InFlight:
    """What one router added per instance since its table was made: requests and tokens
    (prefill: un-cached tokens; decode: KV tokens)."""

    requests: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)

    def add(self, instance: str, tokens: int) -> None:
        self.requests[instance] = self.requests.get(instance, 0) + 1
        self.tokens[instance] = self.tokens.get(instance, 0) + tokens

    def remove(self, instance: str, tokens: int) -> None:
        left = self.requests.get(instance, 0) - 1
        if left <= 0:
            self.requests.pop(instance, None)
            self.tokens.pop(instance, None)
        else:
            self.requests[instance] = left
            self.tokens[instance] -= tokens

    def clear(self) -> None:
        self.requests.clear()
        self.tokens.clear()

    def applied(self, load: InstanceLoad) -> InstanceLoad:
        """``load`` with this router's additions on it."""
        n = self.requests.get(load.id)
        if not n:
            return load
        extra = self.tokens[load.id]
        if load.role == "prefill":
            return dataclasses.replace(
                load, queued_tokens=load.queued_tokens + extra, running_requests=load.running_requests + n
            )
        return dataclasses.replace(  # a decode's queue counts only for colocated requests
            load,
            kv_tokens=load.kv_tokens + extra,
            queued_tokens=load.queued_tokens + extra,
            running_requests=load.running_requests + n,
        )


def prefill_from_table(
    table: DecisionTable, uncached: int, inflight: InFlight, exclude: Collection[str] = ()
) -> tuple[str, int]:
    """(prefill id, bucket) for a request of ``uncached`` tokens to compute."""
    bucket = table.bucket_of(uncached)
    engines = [inflight.applied(e) for e in table.prefills if e.id not in exclude]
    if not engines:
        raise NoInstance("no serving prefill instance in the table")
    home = [e.id for e in engines if e.id in table.buckets[bucket]]
    return least_queued(engines, home or [e.id for e in engines]).id, bucket


def decode_from_table(
    table: DecisionTable,
    kv_tokens: int,
    inflight: InFlight,
    exclude: Collection[str] = (),
    colocated: bool = False,
) -> DecodeDecision:
    """The decode for a request holding ``kv_tokens`` (>= 1) of context (``colocated``: the
    decode computes its prompt, see :func:`dsi.balance.decode.choose`)."""
    pool = [inflight.applied(i) for i in table.decodes if i.id not in exclude]
    return choose(max(1, kv_tokens), pool, table.bands, table.decode_cfg, colocated)
