"""Output token counts for frequency and presence penalties, kept by the engine's worker.

To sample position p of a request with a penalty, the sampler needs how often each id occurs in
the request's output before p. With asynchronous scheduling the CPU appends step N's token to
``Request.output`` while the worker already samples step N + 1, so ``output`` can be one token
short there. The counts are therefore the worker's own: they take every token the worker
samples, and they are rebuilt from ``output`` (plus the token the CPU has not appended yet)
whenever they do not describe exactly the tokens before p: on a request's first sample in this
engine (an imported request brings the prefill's tokens in ``output``), or if a step was
dropped. A preemption changes nothing: the output it keeps is the one counted.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from dsi.engine.request import Request


@dataclass(slots=True)
class _Counts:
    length: int  # output tokens counted
    counts: Counter[int]


class OutputCounts:
    """Worker-owned: ``before`` then ``add`` for every token sampled; ``drop`` when the request
    leaves the engine."""

    def __init__(self) -> None:
        self._by_request: dict[int, _Counts] = {}  # id(request) ->

    def before(self, req: Request, position: int, last_token: int | None) -> Counter[int] | None:
        """Counts of the output ids before ``position`` (None when the request has no penalty).
        ``last_token``: the worker's latest sample for the request, which the CPU may not have
        appended to ``output`` yet."""
        if not req.params.penalized:
            return None
        n = position - len(req.prompt)
        held = self._by_request.get(id(req))
        if held is None or held.length != n:
            tokens = req.output[:n]
            if len(tokens) == n - 1 and last_token is not None:
                tokens.append(last_token)
            held = self._by_request[id(req)] = _Counts(len(tokens), Counter(tokens))
        return held.counts

    def add(self, req: Request, token: int) -> None:
        held = self._by_request.get(id(req))
        if held is not None:
            held.counts[token] += 1
            held.length += 1

    def drop(self, req: Request) -> None:
        self._by_request.pop(id(req), None)
