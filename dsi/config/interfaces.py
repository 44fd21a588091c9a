"""HostInterfaces: what the address rule (dsi.config.addresses) asks of this machine's network.

    source_toward("10.0.0.1", 7100)  ->  "10.0.0.11"   the address the kernel sends from toward
                                                         the controller (a UDP connect: no packet
                                                         leaves the host), None without a route
    addresses()                      ->  ["127.0.0.1", "10.0.0.11", ...]   IPv4 address of each
                                                         interface, in interface index order

``addresses`` reads the interfaces with the Linux ``SIOCGIFADDR`` ioctl (IPv4 only); elsewhere it
is empty, and only the route toward the controller finds an address.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Sequence
from typing import Protocol

_SIOCGIFADDR = 0x8915  # linux/sockios.h: an interface's IPv4 address


class Interfaces(Protocol):
    """This host's network as the address rule sees it (tests pass a stand-in)."""

    def source_toward(self, host: str, port: int) -> str | None:
        """The local address a datagram to ``host``:``port`` would leave from; None when the name
        does not resolve or no route reaches it."""
        ...

    def addresses(self) -> Sequence[str]:
        """The address of each interface that has one, loopback included, in interface order."""
        ...


class HostInterfaces:
    """The real interfaces of the machine this process runs on (in its network namespace)."""

    def source_toward(self, host: str, port: int) -> str | None:
        try:
            family, kind, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, kind, proto) as sock:
                sock.connect(sockaddr)  # UDP: picks the route and source address, sends nothing
                return str(sock.getsockname()[0])
        except OSError:  # socket.gaierror included: the name does not resolve
            return None

    def addresses(self) -> Sequence[str]:
        try:
            import fcntl
        except ImportError:  # not a POSIX system
            return []
        found = []
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _, name in socket.if_nameindex():
                request = struct.pack("256s", name.encode()[:15])
                with contextlib.suppress(OSError):  # an interface without an IPv4 address
                    answer = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, request)
                    found.append(socket.inet_ntoa(answer[20:24]))
        return found
