"""The figures of ``dsi bench vllm-cluster``: one side's, and the two sides' ratios against the goals.

Per side, over one replay (:class:`dsi.bench.peers_served_client.ServedRun`): prompt tokens
computed per request (the side's engine counters over the replay / requests sent), TTFT p50 and
p99 (ms, client side: request sent -> first content delta, nearest rank over the streams that
had one), output tokens/s (completion tokens of all streams / the replay's wall time).
Ratios are dsi / peer; a goal holds when the ratio is on its side of the bound.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field

from dsi.bench.peers_served_client import ServedRun, percentile

_OPS = {"<=": operator.le, "<": operator.lt, ">=": operator.ge}


@dataclass(slots=True, frozen=True)
class PromptCounters:
    """One vLLM instance's prompt tokens (since start, or over a replay as a difference), by
    where they came from: ``computed`` (vLLM's ``PromptTokenStats.computed``), ``local_hits``
    (its own prefix cache), ``loaded`` (through a KV connector: dsi's kvstore hits) and
    ``total`` (all prompt tokens, counted separately: ``total - local_hits - loaded`` is a
    second count of ``computed``)."""

    computed: int = 0
    local_hits: int = 0
    loaded: int = 0
    total: int = 0

    def __add__(self, other: PromptCounters) -> PromptCounters:
        return PromptCounters(*(a + b for a, b in zip(_values(self), _values(other), strict=True)))

    def __sub__(self, other: PromptCounters) -> PromptCounters:
        return PromptCounters(*(a - b for a, b in zip(_values(self), _values(other), strict=True)))


def _values(c: PromptCounters) -> tuple[int, int, int, int]:
    return c.computed, c.local_hits, c.loaded, c.total


def deltas(after: list[PromptCounters], before: list[PromptCounters]) -> list[PromptCounters]:
    """Instance by instance, ``after - before``."""
    return [a - b for a, b in zip(after, before, strict=True)]


@dataclass(slots=True, frozen=True)
class SideFigures:
    """One side's figures over one replay (see the module docstring). ``prompt_tokens_per_request``
    is what the server's usage chunks said; ``computed_check_per_request`` is vLLM's prompt
    tokens minus its hits (a second count of the same thing); ``computed_by_instance``,
    ``local_hit_tokens`` and ``loaded_tokens`` say where the prompt tokens went;
    ``ttft_ms_by_request``: each request's TTFT in replay order (None: no content came)."""

    requests: int
    failed: int
    computed_tokens_per_request: float | None
    computed_check_per_request: float | None
    prompt_tokens_per_request: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    output_tokens: int
    wall_s: float
    output_tok_s: float
    computed_by_instance: list[int] = field(default_factory=list)
    local_hit_tokens: int | None = None
    loaded_tokens: int | None = None
    errors: list[str] = field(default_factory=list)
    ttft_ms_by_request: list[float | None] = field(default_factory=list)


def side_figures(run: ServedRun, instances: list[PromptCounters] | None) -> SideFigures:
    """``run``'s figures, with ``instances`` each instance's prompt counters over the run (None: unknown)."""
    n = len(run.streams)
    ttfts = [s.ttft_s * 1000 for s in run.streams if s.ttft_s is not None]
    prompts = [s.prompt_tokens for s in run.streams if s.prompt_tokens]
    total = sum(instances, PromptCounters()) if instances is not None else None

    def per_request(tokens: int | None) -> float | None:
        return round(tokens / n, 1) if tokens is not None and n else None

    return SideFigures(
        requests=n,
        failed=sum(s.error is not None for s in run.streams),
        computed_tokens_per_request=per_request(total.computed if total else None),
        computed_check_per_request=per_request(
            total.total - total.local_hits - total.loaded if total else None
        ),
        prompt_tokens_per_request=round(sum(prompts) / len(prompts), 1) if prompts else None,
        ttft_p50_ms=_round(percentile(ttfts, 50)),
        ttft_p99_ms=_round(percentile(ttfts, 99)),
        output_tokens=run.tokens,
        wall_s=round(run.wall_s, 2),
        output_tok_s=round(run.tok_s, 2),
        computed_by_instance=[c.computed for c in instances or []],
        local_hit_tokens=total.local_hits if total else None,
        loaded_tokens=total.loaded if total else None,
        errors=run.errors[:3],
        ttft_ms_by_request=[_round(s.ttft_s * 1000) if s.ttft_s is not None else None for s in run.streams],
    )


def merged(runs: list[ServedRun]) -> ServedRun:
    """Several runs as one: their streams, and their wall times added."""
    return ServedRun(sum(r.wall_s for r in runs), [s for r in runs for s in r.streams])


@dataclass(slots=True, frozen=True)
class Goal:
    """``figure``'s dsi / peer ratio should be ``op`` ``bound`` (op None: reported, no goal)."""

    figure: str
    op: str | None = None
    bound: float = 0.0

    def __str__(self) -> str:
        return f"{self.op} {self.bound}" if self.op else "none"


CLUSTER_GOALS = (
    Goal("computed_tokens_per_request", "<=", 0.6),
    Goal("ttft_p50_ms", "<", 1.0),
    Goal("ttft_p99_ms", "<", 1.0),
    Goal("output_tok_s", ">=", 1.0),
)
SINGLE_GOALS = (Goal("output_tok_s", ">=", 0.95), Goal("ttft_p50_ms"))


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def compare(dsi: SideFigures | None, peer: SideFigures | None, goals: tuple[Goal, ...]) -> dict[str, dict]:
    """Per goal: both sides' figure, their ratio, the goal and whether it is met (None: no
    ratio, or no goal)."""
    out = {}
    for goal in goals:
        a = getattr(dsi, goal.figure) if dsi else None
        b = getattr(peer, goal.figure) if peer else None
        r = ratio(a, b)
        met = _OPS[goal.op](r, goal.bound) if goal.op and r is not None else None
        out[goal.figure] = {"dsi": a, "peer": b, "dsi_over_peer": r, "goal": str(goal), "met": met}
    return out


def figures_dict(figures: SideFigures | None) -> dict | None:
    return asdict(figures) if figures is not None else None


def _round(value: float | None) -> float | None:
    return round(value, 1) if value is not None else None
