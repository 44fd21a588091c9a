"""The balancers' part of ``dsi status``: which prefill serves which length bucket, the decode
bands and the load spread, asked of every serving balancer in the controller's table.

    BALANCER    BUCKET  TOKENS       SHARE  QUEUED  PREFILL
    balancer-0  0       0-16384      0.62   1200    prefill-0
    balancer-0  1       16384-65536  0.38   0       prefill-1
    ...
    balancer-0  decode long band from 20000 KV tokens: decode-1; spread prefill 1.2 decode 1.0

A balancer that does not answer within the timeout is left out (the instance table still lists it).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import zmq.asyncio

from dsi.errors import DsiError
from dsi.messages.balancer import BalancerState, BalancerStatus
from dsi.messages.control import InstanceTable
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

_COLUMNS = ("BALANCER", "BUCKET", "TOKENS", "SHARE", "QUEUED", "PREFILL")


async def fetch_balancers(
    table: InstanceTable, keys: CurveKeys | None, timeout: float
) -> list[BalancerState]:
    """The state of every serving balancer that answers within ``timeout`` seconds."""
    ctx = zmq.asyncio.Context()
    try:
        addresses = [i.address for i in table.instances if i.role == "balancer" and i.state == "serving"]
        states = await asyncio.gather(*(_ask(a, ctx, keys, timeout) for a in addresses))
        return [s for s in states if s is not None]
    finally:
        ctx.destroy(linger=0)


async def _ask(
    address: str, ctx: zmq.asyncio.Context, keys: CurveKeys | None, timeout: float
) -> BalancerState | None:
    peer = Peer(address, ctx, types=(BalancerState,), peer_id="dsi-status", keys=keys, timeout=timeout)
    try:
        await peer.connect(timeout)
        return await peer.ask(BalancerStatus(), timeout=timeout)
    except DsiError:
        return None
    finally:
        await peer.close()


def balancers_json(states: list[BalancerState]) -> list[dict[str, Any]]:
    """Plain objects (the messages travel as arrays)."""
    out = []
    for s in states:
        data = msgspec.structs.asdict(s)
        data["buckets"] = [msgspec.structs.asdict(b) for b in s.buckets]
        data["instances"] = [msgspec.structs.asdict(i) for i in s.instances]
        out.append(data)
    return out


def format_buckets(states: list[BalancerState]) -> str:
    rows: list[tuple[str, ...]] = [_COLUMNS]
    for s in states:
        rows += [
            (
                s.balancer_id,
                str(b.bucket),
                f"{b.min_tokens}-{b.max_tokens or ''}",
                f"{b.share:g}",
                str(b.queued_tokens),
                ",".join(b.engines) or "-",
            )
            for b in s.buckets
        ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    for s in states:
        band = (
            f"decode long band from {s.long_threshold} KV tokens: {','.join(s.long_band)}"
            if s.long_band
            else "decode: one band"
        )
        spread = " ".join(f"{role} {v:g}" for role, v in sorted(s.spread.items()))
        lines.append(f"{s.balancer_id}  {band}; load spread (max/mean) {spread}")
    return "\n".join(lines)
