"""When an idle engine's first step starts: at once for a lone request, after a burst settles.

A burst of requests (32 clients at once) reaches an engine over some milliseconds. An idle
engine that stepped on the first arrival would prefill the first few alone, then the rest in a
second step that waits for the first, and the first few's handoffs wait for the second: every
time to first token pays for two steps. :func:`gather_delay` holds the first step of an idle
engine while a burst is still arriving::

    arrivals since the last step: a1 .. an (monotonic seconds), the one before them: a0
    lone (n == 1 and a1 - a0 >= gap)       -> step now
    burst                                 -> step at min(an + gap, a1 + MAX_GAPS * gap)

so a request alone is never held, a burst shares one step, and no request waits more than
``MAX_GAPS * gap`` for it. An engine with requests already running never waits (the service
applies this only when the last step left nothing unfinished). Pure: the engine service and the
simulator share it.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_GAPS = 5  # the longest hold, in gaps


def gather_delay(now: float, arrivals: Sequence[float], before: float | None, gap: float) -> float:
    """Seconds to hold the first step of an idle engine (0: step now). ``arrivals``: when the
    requests admitted since the last step arrived, in order; ``before``: when the request before
    them arrived (None: none yet); ``gap``: the quiet time that ends a burst (0: never hold)."""
    if gap <= 0 or not arrivals:
        return 0.0
    first, last = arrivals[0], arrivals[-1]
    burst = len(arrivals) > 1 or (before is not None and first - before < gap)
    if not burst:
        return 0.0
    return max(0.0, min(last + gap, first + MAX_GAPS * gap) - now)
