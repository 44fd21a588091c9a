"""What happened to each request, in columns indexed by request (seconds, tokens, FLOPs).

TTFT = the first token at the client - arrival: waiting for room, prefill queue and forward,
the KV handoff (the first token travels with the handoff) and the request's ``path_s`` (what its
way through gateway and roles adds, outside any instance's queue). TBT of a request = (its last
token - its first) / (output tokens - 1): the mean gap between its tokens; requests of one
output token have none (NaN).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(slots=True)
class Records:
    n: int
    arrival_s: np.ndarray = field(init=False)
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    prompt: np.ndarray = field(init=False)
    output: np.ndarray = field(init=False)
    hit: np.ndarray = field(init=False)  # tokens of the hit the prefill took
    exact: np.ndarray = field(init=False)  # the hit loaded its SWA state (no replay)
    predicted: np.ndarray = field(init=False)  # the hit the entrypoint predicted before routing
    uncached: np.ndarray = field(init=False)  # prompt - hit
    flops: np.ndarray = field(init=False)
    bucket: np.ndarray = field(init=False)
    waited: np.ndarray = field(init=False)  # arrived when no decode had room
    path_s: np.ndarray = field(init=False)  # latency outside the instances (SimConfig.path_s)

    def __post_init__(self) -> None:
        nan = np.full(self.n, np.nan)
        self.arrival_s, self.first_token_s, self.finish_s = nan.copy(), nan.copy(), nan.copy()
        ints = ("prompt", "output", "hit", "predicted", "uncached", "bucket")
        for name in ints:
            setattr(self, name, np.zeros(self.n, dtype=np.int64))
        self.flops = np.zeros(self.n)
        self.path_s = np.zeros(self.n)
        self.exact = np.zeros(self.n, dtype=bool)
        self.waited = np.zeros(self.n, dtype=bool)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s + self.path_s - self.arrival_s

    @property
    def tbt_s(self) -> np.ndarray:
        gaps = np.where(self.output > 1, self.output - 1, np.nan)
        return (self.finish_s - self.first_token_s) / gaps
