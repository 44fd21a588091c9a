"""Where the running requests of a draining decode go: a pure placement policy.

Requests are placed largest KV first, each on the target with the least KV tokens so far
(its reported load plus what was placed on it), as the decode balancer keeps long and short
requests apart by watching total KV length. Worked example::

    place({"a": 900, "b": 300, "c": 200}, {"B": 0, "C": 500})
    # a -> B (B: 900), b -> C (C: 800), c -> C (C: 1000)   => {"a": "B", "b": "C", "c": "C"}
"""

from __future__ import annotations


def place(requests: dict[str, int], targets: dict[str, int]) -> dict[str, str]:
    """request id -> target. ``requests``: request id -> KV tokens it holds; ``targets``: target ->
    KV tokens it holds now. Empty when there is no target."""
    if not targets:
        return {}
    load = dict(targets)
    out: dict[str, str] = {}
    for request_id, tokens in sorted(requests.items(), key=lambda kv: (-kv[1], kv[0])):
        target = min(load, key=lambda t: (load[t], t))
        out[request_id] = target
        load[target] += tokens
    return out
