"""The autoscaler's part of ``dsi status`` and the answer of ``dsi scale``: ask, format, JSON.

    autoscale: every 2s; no scale-down while quota use is above 0.8
    ROLE    SERVING  READY  STARTING  DRAINING  TARGET  POOL  WANTED  QUOTA USE   DEMAND  CAPACITY  MANUAL
    decode  3        1      0         0         3       1/1   4       3/4 (0.75)  4       1.5       -
    last decisions, oldest first:
    15:20:01 decode: serving 1, ready 1, starting 0, demand 4 -> need 3, target 2: take 1, start 1
      rate_limit: 3 is 2 from serving 1, more than max_change 1: 2 this interval

QUOTA USE is serving / max_instances; POOL is ready / pool target; WANTED is how many instances
the role should have (dsi serve starts and stops instances to match).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import zmq.asyncio

from dsi.messages.control import GetScale, ScaleDecision, ScaleRole, ScaleStatus, SetScale
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

_COLUMNS = (
    "ROLE",
    "SERVING",
    "READY",
    "STARTING",
    "DRAINING",
    "TARGET",
    "POOL",
    "WANTED",
    "QUOTA USE",
    "DEMAND",
    "CAPACITY",
    "MANUAL",
)
TABLE_DECISIONS = 10  # the last decisions the table shows (JSON has every one kept)


async def ask_scale(
    address: str, keys: CurveKeys | None, timeout: float, msg: GetScale | SetScale
) -> ScaleStatus:
    """Ask the controller `msg`; DsiError (AskTimeout, PeerLost, InvalidRequest, ...) as raised."""
    ctx = zmq.asyncio.Context()
    peer = Peer(address, ctx, types=(ScaleStatus,), peer_id="dsi-scale", keys=keys, timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        await peer.connect(timeout)
        return await peer.ask(msg, timeout=max(0.1, deadline - time.monotonic()))
    finally:
        await peer.close()
        ctx.destroy(linger=0)


def scale_json(status: ScaleStatus) -> dict[str, Any]:
    """Plain objects; each role adds ``quota_use`` (serving / max_instances)."""
    data: dict[str, Any] = _plain(status)
    for role, raw in zip(status.roles, data["roles"], strict=True):
        raw["quota_use"] = quota_use(role)
    return data


def _plain(value: Any) -> Any:
    """Structs as objects by field name (the wire form is arrays), lists item by item."""
    if isinstance(value, msgspec.Struct):
        return {name: _plain(getattr(value, name)) for name in value.__struct_fields__}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def quota_use(role: ScaleRole) -> float:
    return role.serving / role.max_instances


def format_scale(status: ScaleStatus, decisions: int = TABLE_DECISIONS) -> str:
    """The roles under a header line, then the last `decisions` decisions."""
    if not status.enabled:
        return "autoscale: off (no [autoscale] section)"
    head = (
        f"autoscale: every {status.interval_s:g}s; no scale-down while quota use is above "
        f"{status.quota_threshold:g}"
    )
    lines = [head, *_table([_COLUMNS, *(_row(role) for role in status.roles)])]
    if status.decisions:
        lines.append("last decisions, oldest first:")
        for entry in status.decisions[-decisions:]:
            lines += describe_decision(entry)
    return "\n".join(lines)


def describe_decision(entry: ScaleDecision) -> list[str]:
    """One line of inputs and moves, then one indented line per reason."""
    moves = [
        f"{verb} {count}"
        for verb, count in (
            ("take", entry.take),
            ("return", entry.returned),
            ("stop serving", entry.stop_serving),
            ("stop ready", entry.stop_ready),
            ("start", entry.start),
        )
        if count
    ]
    when = time.strftime("%H:%M:%S", time.localtime(entry.at))
    head = (
        f"{when} {entry.role}: serving {entry.serving}, ready {entry.ready}, starting {entry.starting}, "
        f"demand {entry.demand:g} -> need {entry.need}, target {entry.target}: {', '.join(moves) or 'no move'}"
    )
    return [head, *(f"  {reason}" for reason in entry.reasons)]


def _row(role: ScaleRole) -> tuple[str, ...]:
    return (
        role.role,
        str(role.serving),
        str(role.ready),
        str(role.starting),
        str(role.draining),
        str(role.target),
        f"{role.ready}/{role.pool_target}",
        str(role.wanted),
        f"{role.serving}/{role.max_instances} ({quota_use(role):.2f})",
        f"{role.demand:g}",
        f"{role.capacity:g}",
        "-" if role.manual < 0 else str(role.manual),
    )


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
