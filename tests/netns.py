"""Two network namespaces joined by a veth pair, for tests that need two hosts.

``two_hosts()`` yields (namespace A, namespace B, subnet prefix): A is ``<net>.1``, B is
``<net>.2``. Both are deleted again on exit (which removes the veth pair); the test is skipped
with the reason when the machine cannot create them (not root, no iproute2, no permission).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest


def ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_hosts(tag: str = "") -> Iterator[tuple[str, str, str]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if shutil.which("ip") is None:
        pytest.skip("the ip command (iproute2) is not installed")
    pid = os.getpid()
    ns = (f"dsi{tag}{pid}a", f"dsi{tag}{pid}b")
    veth = (f"dsiv{tag}{pid}a", f"dsiv{tag}{pid}b")
    net = f"10.200.{pid % 250 + 1}"
    created: list[str] = []
    try:
        for name in ns:
            done = ip("netns", "add", name)
            if done.returncode != 0:
                pytest.skip(f"ip netns add failed: {done.stderr.strip()}")
            created.append(name)
        steps = [
            ("link", "add", veth[0], "type", "veth", "peer", "name", veth[1]),
            *[("link", "set", veth[i], "netns", ns[i]) for i in (0, 1)],
            *[("-n", ns[i], "addr", "add", f"{net}.{i + 1}/24", "dev", veth[i]) for i in (0, 1)],
            *[("-n", ns[i], "link", "set", dev, "up") for i in (0, 1) for dev in (veth[i], "lo")],
        ]
        for step in steps:
            done = ip(*step)
            if done.returncode != 0:
                pytest.skip(f"ip {' '.join(step)} failed: {done.stderr.strip()}")
        yield ns[0], ns[1], net
    finally:
        for name in created:  # deleting a namespace deletes its end of the veth pair, and so both
            ip("netns", "del", name)
        ip("link", "del", veth[0])  # only exists if moving it into a namespace failed
