"""Free 127.0.0.1 TCP ports for local clusters, benchmarks and tests.

The kernel picks a port that is free at the moment of asking; it may pick the same one again once
the probe socket is closed. `free_port` remembers what it handed out in this process and never
returns a port twice, so one config's many addresses stay distinct.
"""

from __future__ import annotations

import socket
import threading

_HANDED_OUT: set[int] = set()
_LOCK = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that was free a moment ago and not returned before by this process."""
    with _LOCK:
        while True:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _HANDED_OUT:
                _HANDED_OUT.add(port)
                return port
