"""``dsi status``: the instances the controller knows, as a table or JSON.

    dsi status [--config configs/local.toml] [--controller tcp://HOST:PORT] [--json] [--timeout S]

Under the instances, the autoscaler's roles (quota use, targets, ready pool) and its last
decisions, when the config has an [autoscale] section (see :mod:`dsi.cli.scale_view`).

STATE is the instance's lifecycle state (starting | ready | serving | draining | stopped | dead),
with ``/suspect`` when its heartbeats are late (2.5 intervals) but not yet for the timeout.
PROTOCOL is the control-plane protocol version the instance runs (dsi.messages.version; during a
rolling upgrade two adjacent versions serve side by side).
The JSON also has the controller's lifecycle transition counts and, under ``autoscale``, every
decision kept (the last 100). Each serving balancer adds which prefill serves which length bucket
(see dsi.cli.status_balancers; ``balancers`` in the JSON). Each speculating decode engine adds its
mode, acceptance per draft position and measured step-time curve (see dsi.cli.status_spec; in
the JSON under its ``load``: ``speculative``, ``accept_rates``, ``step_curve``).

FINGERPRINT is an engine instance's machine fingerprint (see dsi.engine.fingerprint): the first 8
chars of its digest and its ISA features; every field is in the JSON under ``fingerprint``. When
the serving instances of one role report different digests, a ``warning:`` line under the table
(``warnings`` in the JSON) names them: exact failover and exact prefix hits cannot hold there.

The controller address comes from --controller, else from the config's [cluster] controller.
With [security] curve = true the config's client key is used. Exit 1 when the controller does
not answer within --timeout seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import msgspec
import uvloop
import zmq.asyncio

from dsi.cli.scale_view import format_scale, scale_json
from dsi.cli.status_balancers import balancers_json, fetch_balancers, format_buckets
from dsi.cli.status_fingerprint import fingerprint_cell, fingerprint_json, fingerprint_warnings
from dsi.cli.status_spec import format_curves, load_json, speculating
from dsi.config import ConfigError, load_config
from dsi.errors import DsiError
from dsi.messages.control import GetScale, InstanceInfo, InstanceTable, ListInstances, ScaleStatus
from dsi.roles.curve import client_keys
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys

DEFAULT_CONFIG = "configs/local.toml"
_COLUMNS = ("INSTANCE", "ROLE", "HOST", "PID", "STATE", "PROTOCOL", "LOAD", "LAST SEEN", "FINGERPRINT")


class ControllerUnreachable(Exception):
    """No answer from the controller in time (down, wrong address, or refused CURVE keys)."""


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("status", help="list the role instances the controller knows")
    add_controller_args(parser)
    parser.set_defaults(func=run)


def add_controller_args(parser: argparse.ArgumentParser, timeout_s: float = 3.0) -> None:
    """--config, --controller, --json and --timeout: how every operator command finds the controller."""
    parser.add_argument(
        "--config",
        default=None,
        help=f"node config (default {DEFAULT_CONFIG}; not read when --controller is given alone)",
    )
    parser.add_argument("--controller", default=None, help="controller endpoint, e.g. tcp://10.0.0.1:7100")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--timeout", type=float, default=timeout_s, help="seconds to wait for the controller")


def run(args: argparse.Namespace) -> int:
    try:
        address, keys = controller_target(args.config, args.controller)
    except (ConfigError, ValueError) as exc:  # ValueError: a key file without its secret key
        print(f"dsi status: {exc}", file=sys.stderr)
        return 2
    try:
        table, scale = uvloop.run(_fetch_status(address, keys, args.timeout))
    except ControllerUnreachable as exc:
        print(f"dsi status: {exc}", file=sys.stderr)
        return 1
    balancers = uvloop.run(fetch_balancers(table, keys, args.timeout))
    if args.json:
        extra = {"autoscale": scale_json(scale)} if scale else {}
        print(json.dumps({**table_json(table), **extra, "balancers": balancers_json(balancers)}, indent=2))
    else:
        parts = ["\n".join([format_table(table.instances), *fingerprint_warnings(table.instances)])]
        parts += [format_scale(scale)] if scale else []
        parts += [format_buckets(balancers)] if balancers else []
        parts += [format_curves(table.instances)] if speculating(table.instances) else []
        print("\n\n".join(parts))
    return 0


async def _fetch_status(
    address: str, keys: CurveKeys | None, timeout: float
) -> tuple[InstanceTable, ScaleStatus | None]:
    """The InstanceTable and, on the same connection, the autoscaler's state (None when it is off
    or the controller does not answer it); ControllerUnreachable after `timeout` s."""
    ctx = zmq.asyncio.Context()
    peer = Peer(
        address, ctx, types=(InstanceTable, ScaleStatus), peer_id="dsi-status", keys=keys, timeout=timeout
    )
    deadline = time.monotonic() + timeout
    try:
        try:
            await peer.connect(timeout)
            table = await peer.ask(ListInstances(), timeout=max(0.1, deadline - time.monotonic()))
        except DsiError as exc:
            raise ControllerUnreachable(
                f"cannot reach the controller at {address} within {timeout:g}s ({exc})"
            ) from None
        try:
            scale = await peer.ask(GetScale(), timeout=timeout)
        except DsiError:  # a controller of an older version does not know GetScale
            scale = None
    finally:
        await peer.close()
        ctx.destroy(linger=0)
    return table, scale if isinstance(scale, ScaleStatus) and scale.enabled else None


async def fetch_instances(address: str, keys: CurveKeys | None, timeout: float) -> InstanceTable:
    """Ask the controller at `address` for its InstanceTable; ControllerUnreachable after `timeout` s."""
    ctx = zmq.asyncio.Context()
    peer = Peer(address, ctx, types=(InstanceTable,), peer_id="dsi-status", keys=keys, timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        await peer.connect(timeout)
        return await peer.ask(ListInstances(), timeout=max(0.1, deadline - time.monotonic()))
    except DsiError as exc:
        raise ControllerUnreachable(
            f"cannot reach the controller at {address} within {timeout:g}s ({exc})"
        ) from None
    finally:
        await peer.close()
        ctx.destroy(linger=0)


def table_json(table: InstanceTable) -> dict[str, Any]:
    """{"controller": id, "instances": [{instance_id, role, ..., "load": {running, ...},
    "fingerprint": {digest, ...} | null}, ...], "transitions": [{role, from, to, count}, ...],
    "warnings": [line, ...]}"""
    return {
        "controller": table.controller_id,
        "instances": [info_json(info) for info in table.instances],
        "transitions": [
            {"role": t.role, "from": t.before, "to": t.after, "count": t.count} for t in table.transitions
        ],
        "warnings": fingerprint_warnings(table.instances),
    }


def info_json(info: InstanceInfo) -> dict[str, Any]:
    fields = msgspec.structs.asdict(info)
    fields["load"] = load_json(info.load)
    fields["fingerprint"] = fingerprint_json(info.fingerprint)
    return fields


def format_table(instances: list[InstanceInfo]) -> str:
    """One line per instance under a header, columns padded to fit."""
    rows = [_COLUMNS, *(_row(info) for info in instances)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _row(info: InstanceInfo) -> tuple[str, ...]:
    load = info.load
    summary = f"run={load.running} queue={load.queued} kv={load.kv_tokens} inbox={load.inbox}"
    if load.ep_configured:  # an expert-parallel group: ranks serving / configured
        summary += f" ep={load.ep_ranks}/{load.ep_configured}"
    if load.speculative:
        summary += f" spec={load.speculative}"
    return (
        info.instance_id,
        info.role,
        info.host,
        str(info.pid),
        f"{info.state}/suspect" if info.suspect else info.state,
        str(info.protocol),
        summary,
        f"{info.last_seen_s:.1f}s ago",
        fingerprint_cell(info),
    )


def controller_target(config: str | None, controller: str | None) -> tuple[str, CurveKeys | None]:
    """The controller address and the client keys to use."""
    if controller is not None and config is None:
        return controller, None
    cfg = load_config(config or DEFAULT_CONFIG)
    return controller or cfg.cluster.controller, client_keys(cfg.security)
