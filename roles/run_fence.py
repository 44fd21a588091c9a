"""Work meant for an earlier run of an instance is refused by the run that replaced it.

A restarted instance keeps its id and its control address, so a message sent to the run that
died can reach the new one: the caller's connection reconnects to the address by itself, and a
message that waited in a socket queue meanwhile goes out then, although its caller gave up on it
long before (it timed out, or learnt that the instance died) and re-ran the request elsewhere,
perhaps on this very run. Served, it would run a request twice, the second admission failing
with "request id already in use". The gateway therefore names the run it sends a request to
(``Generate.instance_run``: the ``started_at`` the controller lists for the instance), and an
engine role answers a request meant for another run with ``PeerLost``: the run it was meant
for is gone, which is what its caller (if one still waits) is told, and it re-routes as for a
lost instance. ``instance_run = 0`` (a sender that names none, a test) means any run.
"""

from __future__ import annotations

from dsi.errors import PeerLost


def check_run(name: str, started_at: float, meant_for: float) -> None:
    """Raise ``PeerLost`` unless ``meant_for`` (unix seconds; 0: any) is this run's ``started_at``."""
    if meant_for and meant_for != started_at:
        raise PeerLost(
            f"{name}: the request was sent to its run started at {meant_for:.6f}, which is gone "
            f"(this run started at {started_at:.6f})"
        )
