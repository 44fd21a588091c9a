"""The hosts of a chaos bench: one network namespace per host, all on one bridge.

    root namespace:  bridge dcb<pid>  <net>.254/24   (the bench's load and probes reach every host)
                        |        |        |        |        |        |
    namespaces:       gw .1    p0 .11   p1 .12   d0 .21   d1 .22   kv .31
                     (veth pair per host: dc<pid><host> on the bridge, dc<pid><host>n inside)

``<net>`` is ``10.201.<pid % 250 + 1>``, one subnet per bench process. ``Fabric.close`` deletes
every namespace (which deletes its veth pair) and the bridge; ``Fabric.create`` raises
``NetnsUnavailable`` with the reason where namespaces cannot be made (not root, no iproute2, no
permission), after removing whatever it made.

A partition of two hosts is a blackhole route on each side for the other's address: packets
between them are discarded by the sender's kernel (a new connect fails with EINVAL; an open TCP
connection's segments and retransmissions go nowhere) until the routes are removed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

HOSTS = {"gw": 1, "p0": 11, "p1": 12, "d0": 21, "d1": 22, "kv": 31}  # host -> last octet


class NetnsUnavailable(RuntimeError):
    """Namespaces cannot be made here; the message says why."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """``ip ARGS``; NetnsUnavailable with its stderr when it fails and ``check``."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass(slots=True)
class Fabric:
    """Namespaces and addresses of the hosts of one bench process."""

    tag: str
    net: str
    made: list[str] = field(default_factory=list)  # namespaces made, in order
    bridge: str = ""
    partitions: set[tuple[str, str]] = field(default_factory=set)

    @classmethod
    def create(cls, pid: int | None = None) -> Fabric:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("the ip command (iproute2) is not installed")
        pid = os.getpid() if pid is None else pid
        fabric = cls(tag=f"dc{pid}", net=f"10.201.{pid % 250 + 1}")
        try:
            fabric._build()
        except BaseException:
            fabric.close()
            raise
        return fabric

    def _build(self) -> None:
        self.bridge = f"{self.tag}br"
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.net}.254/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for host, octet in HOSTS.items():
            ns, outer, inner = self.namespace(host), f"{self.tag}{host}", f"{self.tag}{host}n"
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            ip("link", "set", inner, "netns", ns)
            ip("link", "set", outer, "master", self.bridge)
            ip("link", "set", outer, "up")
            ip("-n", ns, "addr", "add", f"{self.net}.{octet}/24", "dev", inner)
            for dev in (inner, "lo"):
                ip("-n", ns, "link", "set", dev, "up")

    def namespace(self, host: str) -> str:
        return f"{self.tag}{host}"

    def address(self, host: str) -> str:
        return f"{self.net}.{HOSTS[host]}"

    def device(self, host: str) -> str:
        """The host's interface inside its namespace."""
        return f"{self.tag}{host}n"

    def exec_prefix(self, host: str) -> list[str]:
        """Prepend to an argv to run it on ``host``."""
        return ["ip", "netns", "exec", self.namespace(host)]

    def partition(self, a: str, b: str) -> None:
        """Cut ``a`` and ``b`` apart (both directions) until ``heal(a, b)``."""
        for src, dst in ((a, b), (b, a)):
            ip("-n", self.namespace(src), "route", "add", "blackhole", f"{self.address(dst)}/32")
        self.partitions.add((a, b))

    def heal(self, a: str, b: str) -> None:
        for src, dst in ((a, b), (b, a)):
            ip("-n", self.namespace(src), "route", "del", "blackhole", f"{self.address(dst)}/32", check=False)
        self.partitions.discard((a, b))

    def close(self) -> None:
        """Delete every namespace and the bridge (idempotent)."""
        for a, b in list(self.partitions):
            self.heal(a, b)
        while self.made:
            ip("netns", "del", self.made.pop(), check=False)
        for host in HOSTS:  # a veth end left in the root namespace by a half-made host
            if os.path.exists(f"/sys/class/net/{self.tag}{host}"):
                ip("link", "del", f"{self.tag}{host}", check=False)
        if self.bridge:
            ip("link", "del", self.bridge, check=False)
            self.bridge = ""
