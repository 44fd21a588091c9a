"""Gateway metrics in the Prometheus text format (counters and histograms with labels).

dsi_requests_total{protocol, status}       requests by protocol and HTTP status
dsi_errors_total{type}                     errors by type
dsi_prompt_tokens_total / dsi_generated_tokens_total
dsi_ttft_seconds (histogram)               time to first token
dsi_itl_seconds (histogram)                inter-token latency (per engine step's chunk)
dsi_requests_in_flight (gauge)
dsi_sse_buffer_peak_bytes (gauge)          the most bytes one stream's transport held unsent
                                           (its client behind); bounded, see entrypoint.sse
dsi_prefix_lookup_tokens_total / dsi_prefix_hit_tokens_total   prompt tokens looked up in the
                                           CHECK replica, and those it holds (hit ratio)
dsi_engine_cached_tokens_total             prompt tokens the engines reused from the store
                                           (what usage reports; below the hits when a block
                                           was corrupt or the store away)
+ the lines of each ``sources`` callable: the replica's gauges (see PrefixLookup) and
  dsi_instance_transitions_total{role, from, to}, the controller's lifecycle moves, which the
  controller has no HTTP to serve: they travel in the InstanceTable the gateway fetches every
  refresh (see DecodePool.metric_lines), so they lag the controller by up to one refresh
  and, with balancers configured, the routes they gave or the local picks made instead, and
  the balancer's buckets and load spread (see dsi.roles.entrypoint.router)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(slots=True)
class Histogram:
    buckets: tuple[float, ...] = _LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(_LATENCY_BUCKETS) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str) -> list[str]:
        out, running = [], 0
        for bound, count in zip(self.buckets, self.counts, strict=False):
            running += count
            out.append(f'{name}_bucket{{le="{bound}"}} {running}')
        out.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        out += [f"{name}_sum {self.total:.6f}", f"{name}_count {self.n}"]
        return out


@dataclass(slots=True)
class Metrics:
    requests: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    prompt_tokens: int = 0
    generated_tokens: int = 0
    in_flight: int = 0
    sse_buffer_peak_bytes: int = 0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    prefix_lookup_tokens: int = 0
    prefix_hit_tokens: int = 0
    engine_cached_tokens: int = 0
    sources: list[Callable[[], list[str]]] = field(default_factory=list)

    def request_done(self, protocol: str, status: int) -> None:
        self.requests[(protocol, status)] += 1

    def error(self, kind: str) -> None:
        self.errors[kind] += 1

    def render(self) -> str:
        lines = ["# TYPE dsi_requests_total counter"]
        lines += [
            f'dsi_requests_total{{protocol="{p}",status="{s}"}} {n}'
            for (p, s), n in sorted(self.requests.items())
        ]
        lines.append("# TYPE dsi_errors_total counter")
        lines += [f'dsi_errors_total{{type="{t}"}} {n}' for t, n in sorted(self.errors.items())]
        lines += [
            "# TYPE dsi_prompt_tokens_total counter",
            f"dsi_prompt_tokens_total {self.prompt_tokens}",
            "# TYPE dsi_generated_tokens_total counter",
            f"dsi_generated_tokens_total {self.generated_tokens}",
            "# TYPE dsi_requests_in_flight gauge",
            f"dsi_requests_in_flight {self.in_flight}",
            "# TYPE dsi_sse_buffer_peak_bytes gauge",
            f"dsi_sse_buffer_peak_bytes {self.sse_buffer_peak_bytes}",
            "# TYPE dsi_ttft_seconds histogram",
            *self.ttft.lines("dsi_ttft_seconds"),
            "# TYPE dsi_itl_seconds histogram",
            *self.itl.lines("dsi_itl_seconds"),
            "# TYPE dsi_prefix_lookup_tokens_total counter",
            f"dsi_prefix_lookup_tokens_total {self.prefix_lookup_tokens}",
            "# TYPE dsi_prefix_hit_tokens_total counter",
            f"dsi_prefix_hit_tokens_total {self.prefix_hit_tokens}",
            "# TYPE dsi_engine_cached_tokens_total counter",
            f"dsi_engine_cached_tokens_total {self.engine_cached_tokens}",
        ]
        for source in self.sources:
            lines += source()
        return "\n".join(lines) + "\n"
