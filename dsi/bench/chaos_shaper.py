"""Delay and loss on the packets a host sends to some addresses, without the netem qdisc.

Run inside the sending host's namespace (``ip netns exec NS python -m dsi.bench.chaos_shaper``)::

    socket --> route <dst>/32 dev dcsh --> TUN dcsh --> this process: drop with p = loss,
       else hold delay_ms --> write back into dcsh --> rule "iif dcsh lookup 7" --> table 7:
       <net>/24 dev <host device> --> the bridge --> dst

Each IP packet (already segmented to the TUN's MTU) is delayed by ``delay_ms`` in arrival order;
a dropped one is lost on the wire, so TCP retransmits it after its own timeout, as over a lossy
link. Nothing but the routed destinations passes through the TUN; replies are shaped only where
the other host runs a shaper too. ``accept_local`` and ``rp_filter = 0`` on the TUN let the host
forward its own packets; forwarding is turned on in the namespace. The TUN and its routes go
away with this process (SIGTERM or SIGKILL); it prints ``READY`` once the routes are in place.

    python -m dsi.bench.chaos_shaper --device IF --net 10.201.7 --dst A [--dst B ...]
                                     [--delay-ms 100] [--loss 0.02] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import os
import random
import signal
import struct
import subprocess
import sys

TUN_NAME = "dcsh"
_TUNSETIFF = 0x400454CA
_IFF_TUN, _IFF_NO_PI = 0x0001, 0x1000
_TABLE = "7"


def open_tun(name: str) -> int:
    """A file descriptor of a new TUN device ``name`` (raw IP packets, no packet info)."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
    return fd


def _sh(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, timeout=10)


def _route(device: str, net: str, dsts: list[str]) -> None:
    for key, value in (
        ("net/ipv4/ip_forward", "1"),
        (f"net/ipv4/conf/{TUN_NAME}/rp_filter", "0"),
        ("net/ipv4/conf/all/rp_filter", "0"),
        (f"net/ipv4/conf/{TUN_NAME}/accept_local", "1"),
    ):
        with open(f"/proc/sys/{key}", "w") as f:
            f.write(value)
    _sh("ip", "link", "set", TUN_NAME, "up")
    _sh("ip", "route", "replace", f"{net}.0/24", "dev", device, "table", _TABLE)
    if b"iif dcsh" not in subprocess.run(["ip", "rule"], capture_output=True).stdout:
        _sh("ip", "rule", "add", "iif", TUN_NAME, "lookup", _TABLE, "pref", "100")
    for dst in dsts:
        _sh("ip", "route", "add", f"{dst}/32", "dev", TUN_NAME)


async def shape(fd: int, delay_s: float, loss: float, rng: random.Random) -> None:
    """Forward every packet read from ``fd`` back into it after ``delay_s``, dropping each with
    probability ``loss``; until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    def forward(packet: bytes) -> None:
        with contextlib.suppress(OSError):  # the route is gone or the queue is full: lost, as on a wire
            os.write(fd, packet)

    def readable() -> None:
        while True:
            try:
                packet = os.read(fd, 65536)
            except BlockingIOError:
                return
            if rng.random() >= loss:
                loop.call_later(delay_s, forward, packet)

    loop.add_reader(fd, readable)
    await stop.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="chaos_shaper")
    p.add_argument("--device", required=True, help="the host's interface toward the bridge")
    p.add_argument("--net", required=True, help="the hosts' /24 prefix, e.g. 10.201.7")
    p.add_argument("--dst", action="append", required=True, help="a destination address to shape")
    p.add_argument("--delay-ms", type=float, default=100.0)
    p.add_argument("--loss", type=float, default=0.02)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    fd = open_tun(TUN_NAME)
    _route(args.device, args.net, args.dst)
    print("READY", flush=True)
    asyncio.run(shape(fd, args.delay_ms / 1000, args.loss, random.Random(args.seed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
