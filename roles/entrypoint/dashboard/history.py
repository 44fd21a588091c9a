"""The gateway's metrics over time: one point per sample interval, the last ``keep`` kept.

Each point is taken from the differences of the gateway's counters and histograms since the
previous sample, so it describes that interval only:

    at                     unix seconds the interval ended
    ttft_p50, ttft_p95     time to first token of the requests that got theirs in the interval,
    ttft_mean              seconds (None: no first token in the interval)
    tbt_p50, tbt_p95,      time between tokens (the gateway's inter-token latency: one value per
    tbt_mean               engine step's chunk), seconds (None: no token in the interval)
    hit_rate               predicted prefix hit tokens / prompt tokens looked up (None: no lookup)
    requests_per_s         requests answered per second (any status)
    tokens_per_s           generated tokens per second
    in_flight              requests in flight at the sample

The percentiles are estimated from the histogram buckets as Prometheus' ``histogram_quantile``
does (linear inside the bucket), so they are only as fine as the buckets (see metrics.py).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from dsi.roles.entrypoint.metrics import Histogram, Metrics


def histogram_quantile(bounds: tuple[float, ...], counts: list[int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of observations counted per bucket: ``counts[i]`` observations
    in (bounds[i - 1], bounds[i]] and ``counts[-1]`` above the last bound (reported as the last
    bound). None when nothing was counted.

    >>> histogram_quantile((0.1, 0.2, 0.4), [0, 4, 4, 0], 0.5)
    0.2
    """
    total = sum(counts)
    if total == 0:
        return None
    rank, below = q * total, 0
    for i, count in enumerate(counts):
        if count and below + count >= rank:
            if i == len(bounds):  # above every bound: the last bound is all that is known
                return bounds[-1]
            lower = bounds[i - 1] if i else 0.0
            return lower + (bounds[i] - lower) * (rank - below) / count
        below += count
    return bounds[-1]


@dataclass(slots=True, frozen=True)
class _Totals:
    """The cumulative values a point is the difference of."""

    ttft: tuple[list[int], float, int]  # (bucket counts, sum s, count)
    tbt: tuple[list[int], float, int]
    lookup_tokens: int
    hit_tokens: int
    requests: int
    generated_tokens: int

    @classmethod
    def of(cls, m: Metrics) -> _Totals:
        return cls(
            _hist(m.ttft),
            _hist(m.itl),
            m.prefix_lookup_tokens,
            m.prefix_hit_tokens,
            sum(m.requests.values()),
            m.generated_tokens,
        )


def _hist(h: Histogram) -> tuple[list[int], float, int]:
    return list(h.counts), h.total, h.n


class MetricsHistory:
    """``keep``: points kept (the oldest dropped first)."""

    def __init__(self, keep: int = 300) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.points: deque[dict[str, Any]] = deque(maxlen=keep)
        self._last: tuple[float, _Totals] | None = None

    def sample(self, now: float, metrics: Metrics) -> dict[str, Any] | None:
        """Add the point of the interval since the previous sample (``now``: unix seconds) and
        return it; the first sample only sets the start (None)."""
        totals = _Totals.of(metrics)
        last, self._last = self._last, (now, totals)
        if last is None or now <= last[0]:
            return None
        since, before = last
        seconds = now - since
        point: dict[str, Any] = {"at": now}
        for name, h, bounds in (
            ("ttft", totals.ttft, metrics.ttft.buckets),
            ("tbt", totals.tbt, metrics.itl.buckets),
        ):
            old = before.ttft if name == "ttft" else before.tbt
            counts = [a - b for a, b in zip(h[0], old[0], strict=True)]
            n = h[2] - old[2]
            point[f"{name}_p50"] = histogram_quantile(bounds, counts, 0.5)
            point[f"{name}_p95"] = histogram_quantile(bounds, counts, 0.95)
            point[f"{name}_mean"] = (h[1] - old[1]) / n if n else None
        looked = totals.lookup_tokens - before.lookup_tokens
        point["hit_rate"] = (totals.hit_tokens - before.hit_tokens) / looked if looked else None
        point["requests_per_s"] = (totals.requests - before.requests) / seconds
        point["tokens_per_s"] = (totals.generated_tokens - before.generated_tokens) / seconds
        point["in_flight"] = metrics.in_flight
        self.points.append(point)
        return point
