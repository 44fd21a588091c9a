"""Seeded workload generators: single-turn requests or multi-turn sessions, over an arrival
process (:mod:`dsi.sim.arrivals`). The same config and seed always give the same requests.

    poisson | bursty | diurnal   single-turn requests (rate: requests/s): a system prompt (one of
                                 ``system_prompts``, Zipf popularity) + a fresh message
    chat | agent                 sessions (rate: new sessions/s, arriving by ``arrival``):
                                 turns of message + answer that stay in the context, then,
                                 with probability ``return_p``, a return after a long gap
                                 (log-normal: median ``return_median_s``, sigma
                                 ``return_sigma``: a long tail of multi-day returns) with more
                                 turns on the same context. ``chat`` is chatbot traffic (7-day
                                 TTL class), ``agent`` agent traffic (3-day class)

Lengths are log-normal around a median (tokens). A context that would pass ``max_context``
starts over from its system prompt (a new conversation of the same session).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from dsi.kvcache.hashchain import HashChain
from dsi.sim.arrivals import PROCESSES
from dsi.sim.sessions import Context
from dsi.sim.workload import SimRequest

KINDS = ("poisson", "bursty", "diurnal", "chat", "agent")


@dataclass(slots=True, frozen=True, kw_only=True)
class Shape:
    """The content of one kind of traffic. Tokens, seconds, probabilities."""

    traffic_class: str
    system_prompts: int = 16
    system_tokens: int = 2_048
    message_tokens: int = 600  # median
    message_sigma: float = 1.0
    output_tokens: int = 300  # median
    output_sigma: float = 0.8
    turns: float = 1.0  # mean turns per visit (geometric)
    think_s: float = 60.0  # mean gap between turns (exponential)
    return_p: float = 0.0  # probability of coming back after each visit
    return_median_s: float = 86_400.0
    return_sigma: float = 1.2
    max_context: int = 131_072


SHAPES = {
    "single": Shape(traffic_class="chatbot"),
    "chat": Shape(
        traffic_class="chatbot",
        message_tokens=400,
        output_tokens=400,
        turns=4.0,
        think_s=60.0,
        return_p=0.6,
        return_median_s=1.5 * 86_400,
        return_sigma=1.2,
    ),
    "agent": Shape(
        traffic_class="agent",
        system_prompts=8,
        system_tokens=8_192,
        message_tokens=1_500,
        output_tokens=250,
        output_sigma=0.6,
        turns=20.0,
        think_s=5.0,
        return_p=0.5,
        return_median_s=86_400.0,
        return_sigma=1.5,
        max_context=262_144,
    ),
}


@dataclass(slots=True, frozen=True, kw_only=True)
class GeneratorConfig:
    kind: str = "poisson"
    rate: float = 2.0  # requests/s (single-turn kinds) or new sessions/s (chat, agent)
    hours: float = 1.0
    seed: int = 0
    arrival: str = "poisson"  # session starts of chat / agent: poisson, bursty or diurnal
    period_s: float = 86_400.0  # diurnal period
    peak_to_trough: float = 4.0  # diurnal
    message_tokens: int = 0  # median message length; 0 = the kind's
    message_sigma: float = 0.0  # its log-normal sigma; 0 = the kind's
    output_tokens: int = 0  # median answer length; 0 = the kind's

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown generator {self.kind!r}; choose from {', '.join(KINDS)}")
        if self.arrival not in PROCESSES:
            raise ValueError(f"unknown arrival process {self.arrival!r}; choose from {', '.join(PROCESSES)}")
        if not self.rate > 0 or not self.hours > 0:
            raise ValueError("a generator needs rate > 0 and hours > 0")
        if min(self.message_tokens, self.output_tokens, self.message_sigma) < 0:
            raise ValueError("message_tokens, message_sigma and output_tokens must be >= 0")

    def shape(self) -> Shape:
        """The content shape of this kind, with the overrides applied."""
        shape = SHAPES.get(self.kind, SHAPES["single"])
        return dataclasses.replace(
            shape,
            message_tokens=self.message_tokens or shape.message_tokens,
            message_sigma=self.message_sigma or shape.message_sigma,
            output_tokens=self.output_tokens or shape.output_tokens,
        )

    @property
    def process(self) -> str:
        return self.kind if self.kind in ("poisson", "bursty", "diurnal") else self.arrival


def generate(cfg: GeneratorConfig, block_size: int = 128) -> list[SimRequest]:
    """The requests of ``cfg``, sorted by arrival (ties by session, then turn)."""
    rng = random.Random(cfg.seed)
    duration = cfg.hours * 3600.0
    process = PROCESSES[cfg.process]
    kwargs: dict[str, float] = {}
    if cfg.process == "diurnal":  # the peak at 14:00 of the (possibly compressed) day
        kwargs = {
            "period_s": cfg.period_s,
            "peak_to_trough": cfg.peak_to_trough,
            "peak_s": cfg.period_s * 14 / 24,
        }
    starts = process(rng, cfg.rate, duration, **kwargs)
    shape = cfg.shape()
    chain = HashChain(root_seed=0, model="sim", block_size=block_size)
    rows: list[tuple[float, int, int, int, object, object, int]] = []
    uids = iter(range(1 << 30, 1 << 31))  # message and answer segments; system prompts use 0..k
    for session, start in enumerate(starts):
        for turn, row in enumerate(_session(rng, shape, chain, start, duration, uids)):
            rows.append((row[0], session, turn, *row[1:]))
    rows.sort(key=lambda r: (r[0], r[1], r[2]))
    return [
        SimRequest(
            id=i,
            arrival_s=t,
            prompt_tokens=prompt,
            output_tokens=output,
            keys=keys,  # type: ignore[arg-type]
            persist_keys=persist,  # type: ignore[arg-type]
            traffic_class=shape.traffic_class,
            session=session if cfg.kind in ("chat", "agent") else -1,
        )
        for i, (t, session, _turn, prompt, keys, persist, output) in enumerate(rows)
    ]


def _session(rng: random.Random, shape: Shape, chain: HashChain, start: float, duration: float, uids):
    """(arrival, prompt tokens, keys, persist keys, output tokens) of every turn of one session."""
    system = _zipf(rng, shape.system_prompts)
    context, t = _fresh(chain, shape, system), start
    while t < duration:
        for _ in range(_geometric(rng, shape.turns)):
            if t >= duration:
                return
            message = _lognormal(rng, shape.message_tokens, shape.message_sigma)
            output = _lognormal(rng, shape.output_tokens, shape.output_sigma)
            if context.tokens + message + output > shape.max_context:
                context = _fresh(chain, shape, system)
            prompt, keys, persist = context.turn(next(uids), message, next(uids), output)
            yield t, prompt, keys, persist, output
            t += rng.expovariate(1.0 / shape.think_s)
        if rng.random() >= shape.return_p:
            return
        t += rng.lognormvariate(math.log(shape.return_median_s), shape.return_sigma)


def _fresh(chain: HashChain, shape: Shape, system: int) -> Context:
    context = Context(chain)
    context.extend(system, shape.system_tokens)
    return context


def _zipf(rng: random.Random, n: int) -> int:
    return rng.choices(range(n), weights=[1.0 / (k + 1) for k in range(n)])[0]


def _geometric(rng: random.Random, mean: float) -> int:
    """1, 2, 3 ... with the given mean (>= 1)."""
    if mean <= 1:
        return 1
    return 1 + int(math.log(1.0 - rng.random()) / math.log(1.0 - 1.0 / mean))


def _lognormal(rng: random.Random, median: int, sigma: float) -> int:
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))
