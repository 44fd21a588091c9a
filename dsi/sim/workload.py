"""What a simulated request is: arrival, lengths, and the chain keys of its full pages.

A workload is a list of :class:`SimRequest` sorted by arrival. The keys are what the real
system hashes (``dsi.kvcache.hashchain``): ``keys`` are the prompt's full pages, the ones a
prefix hit can cover; ``persist_keys`` extend them over the output (the full pages of the
prompt and output together), what the decode persists when the request ends. Where a source
cannot say what the output was (the Mooncake traces), ``persist_keys`` are the prompt's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dsi.kvcache.index import TRAFFIC_CLASSES

EMPTY_KEYS = np.zeros((0, 2), dtype=np.uint64)


@dataclass(slots=True, frozen=True)
class SimRequest:
    """One request. Times in seconds from the workload's start; lengths in tokens."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # >= 1; the first is sampled by the prefill
    keys: np.ndarray  # [prompt_tokens // block, 2] uint64 chain keys of the prompt's full pages
    persist_keys: np.ndarray  # [n, 2] uint64: full pages of prompt + output (n >= len(keys))
    traffic_class: str = "chatbot"  # sets the store TTL (dsi.kvcache.index.TRAFFIC_CLASSES)
    session: int = -1  # the conversation it belongs to (-1: none)

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"request {self.id}: prompt and output need >= 1 token")
        if self.traffic_class not in TRAFFIC_CLASSES:
            raise ValueError(
                f"request {self.id}: traffic class {self.traffic_class!r} is not one of {TRAFFIC_CLASSES}"
            )
        if len(self.persist_keys) < len(self.keys):
            raise ValueError(f"request {self.id}: persist_keys must extend keys")


def time_scaled(requests: Sequence[SimRequest], factor: float) -> list[SimRequest]:
    """Arrivals divided by ``factor`` (> 1 compresses: the same requests at a higher rate)."""
    if not factor > 0:
        raise ValueError(f"a time scale must be > 0, got {factor}")
    if factor == 1:
        return list(requests)
    return [dataclasses.replace(r, arrival_s=r.arrival_s / factor) for r in requests]


def span_s(requests: Sequence[SimRequest]) -> float:
    """Seconds from the first arrival to the last (0 for fewer than two requests)."""
    return requests[-1].arrival_s - requests[0].arrival_s if len(requests) > 1 else 0.0
