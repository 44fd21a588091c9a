"""``dsi drain``: take an instance offline; its work moves to the others.

    dsi drain INSTANCE [--grace 60] [--json] [--config configs/local.toml] [--controller tcp://HOST:PORT]

The controller marks the instance ``draining`` at once (the gateway sends it no new work) and
passes the order on. After ``--grace`` seconds a decode moves every unfinished request, with its
KV pages, SWA rings, compressor state and sampler position, to other decode instances (full
pages are pre-copied during the grace period, so the switch moves only what was written since);
a prefill finishes its work in flight. Then the instance stops. ``dsi undrain`` cancels during
the grace period.

Prints the instance's row (or JSON). Exit 1: the controller did not answer, or refused the
order (unknown instance, a final state); exit 2: a bad config.
"""

from __future__ import annotations

import argparse
import json
import sys

import msgspec
import uvloop
import zmq.asyncio

from dsi.cli.status import (
    ControllerUnreachable,
    add_controller_args,
    controller_target,
    format_table,
    info_json,
)
from dsi.config import ConfigError
from dsi.errors import DsiError
from dsi.messages import ALL, Message
from dsi.messages.control import Drain, InstanceInfo
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("drain", help="take an instance offline, moving its work to the others")
    parser.add_argument("instance", metavar="INSTANCE", help="instance id, as `dsi status` lists it")
    parser.add_argument(
        "--grace", type=float, default=60.0, help="seconds before its work moves (default 60)"
    )
    add_controller_args(parser, timeout_s=10.0)
    parser.set_defaults(func=lambda args: order(args, "drain", Drain(args.instance, args.grace)))


def order(args: argparse.Namespace, name: str, msg: Message) -> int:
    """Send an operator's order to the controller and print the instance it answers with."""
    try:
        address, keys = controller_target(args.config, args.controller)
    except (ConfigError, ValueError) as exc:
        print(f"dsi {name}: {exc}", file=sys.stderr)
        return 2
    try:
        info = uvloop.run(ask_controller(address, keys, msg, args.timeout))
    except (ControllerUnreachable, DsiError) as exc:
        text = f"{exc.code}: {exc.message}" if isinstance(exc, DsiError) else str(exc)
        print(f"dsi {name}: {text}", file=sys.stderr)
        return 1
    print(json.dumps(info_json(info), indent=2) if args.json else format_table([info]))
    return 0


async def ask_controller(address: str, keys: CurveKeys | None, msg: Message, timeout: float) -> InstanceInfo:
    """The controller's answer to ``msg`` (an InstanceInfo); its refusal raised as DsiError,
    ControllerUnreachable when it does not answer within ``timeout`` seconds."""
    ctx = zmq.asyncio.Context()
    peer = Peer(
        address, ctx, types=ALL, peer_id=f"dsi-{type(msg).__name__.lower()}", keys=keys, timeout=timeout
    )
    try:
        try:
            await peer.connect(timeout)
        except DsiError as exc:
            raise ControllerUnreachable(
                f"cannot reach the controller at {address} within {timeout:g}s ({exc})"
            ) from None
        answer = await peer.ask(msg, timeout=timeout)
        if not isinstance(answer, InstanceInfo):
            raise ControllerUnreachable(f"unexpected answer {msgspec.structs.asdict(answer)}")
        return answer
    finally:
        await peer.close()
        ctx.destroy(linger=0)
