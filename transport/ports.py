"""Free TCP ports for local clusters, benchmarks and tests.

The kernel picks a port that is free at the moment of asking; it may pick the same one again once
the probe socket is closed. `free_port` remembers what it handed out in this process and never
returns a port twice, so one config's many addresses stay distinct.

``DSI_PORT_RANGE=LO-HI`` in the environment keeps every port picked here inside [LO, HI] (both
included): for a host whose firewall opens one range, and for processes that share a host and must
not pick each other's ports, each given a range of its own (the test suite's parallel workers
are). Processes started with that environment inherit the range. Without it the kernel picks, from
its ephemeral range (``net.ipv4.ip_local_port_range``).
"""

from __future__ import annotations

import os
import random
import socket
import threading
from collections.abc import Mapping

RANGE_VARIABLE = "DSI_PORT_RANGE"

_HANDED_OUT: set[int] = set()
_LOCK = threading.Lock()


def port_range(env: Mapping[str, str] = os.environ) -> tuple[int, int] | None:
    """(first, last) port of ``DSI_PORT_RANGE`` in `env`, or None where it is unset or empty.
    ValueError naming the variable for anything but ``LO-HI`` with 1 <= LO <= HI <= 65535."""
    text = env.get(RANGE_VARIABLE, "").strip()
    if not text:
        return None
    lo, sep, hi = text.partition("-")
    try:
        span = (int(lo), int(hi)) if sep else None
    except ValueError:
        span = None
    if span is None or not 1 <= span[0] <= span[1] <= 65535:
        raise ValueError(
            f"{RANGE_VARIABLE}={text!r}: expected LO-HI, two ports with LO <= HI, such as 20000-24999"
        )
    return span


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago and not returned before by this process,
    inside ``DSI_PORT_RANGE`` where that is set (OSError when none there is free)."""
    span = port_range()
    with _LOCK:
        if span is None:
            port = _kernel_pick(host)
            while port in _HANDED_OUT:
                port = _kernel_pick(host)
        else:
            port = _free_in(host, *span)
        _HANDED_OUT.add(port)
        return port


def _free_in(host: str, first: int, last: int) -> int:
    """The first free port not handed out, scanning [first, last] from a random place in it (so
    processes sharing one range rarely probe the same port at the same moment)."""
    size = last - first + 1
    start = random.randrange(size)
    for step in range(size):
        port = first + (start + step) % size
        if port not in _HANDED_OUT and _bindable(host, port):
            return port
    raise OSError(f"no free TCP port on {host} in {RANGE_VARIABLE} {first}-{last}")


def _kernel_pick(host: str) -> int:
    """The port the kernel gives a socket bound to (host, 0)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True
