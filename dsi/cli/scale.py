"""``dsi scale``: hold a scaled role at a number of serving instances, or hand it back.

    dsi scale ROLE N|auto [--config configs/local.toml] [--controller tcp://HOST:PORT] [--json]

N must be within the role's [min_instances, max_instances] of the [autoscale] section; the
autoscaler then takes N instead of what demand asks for, from its next decision on, still one
``max_change`` per interval and never scaling down while quota use is above the threshold.
``auto`` gives the role back to demand. Prints the autoscaler's state (as ``dsi status`` does)
or, with --json, its JSON. Exit 2 on a refused target (out of bounds, role not scaled,
autoscaling off) or a bad config, 1 when the controller does not answer within --timeout seconds.
"""

from __future__ import annotations

import argparse
import json
import sys

import uvloop

from dsi.cli.scale_view import ask_scale, format_scale, scale_json
from dsi.cli.status import add_controller_args, controller_target
from dsi.config import ConfigError
from dsi.errors import DsiError, InvalidRequest
from dsi.messages.control import SetScale

AUTO = -1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("scale", help="hold a scaled role at N serving instances (or 'auto')")
    parser.add_argument("role", help="a scaled role: prefill or decode")
    parser.add_argument("instances", type=_count, help="serving instances, or 'auto' to follow demand again")
    add_controller_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        address, keys = controller_target(args.config, args.controller)
    except (ConfigError, ValueError) as exc:
        print(f"dsi scale: {exc}", file=sys.stderr)
        return 2
    try:
        status = uvloop.run(ask_scale(address, keys, args.timeout, SetScale(args.role, args.instances)))
    except InvalidRequest as exc:
        print(f"dsi scale: {exc}", file=sys.stderr)
        return 2
    except DsiError as exc:
        print(
            f"dsi scale: cannot reach the controller at {address} within {args.timeout:g}s ({exc})",
            file=sys.stderr,
        )
        return 1
    print(json.dumps(scale_json(status), indent=2) if args.json else format_scale(status))
    return 0


def _count(text: str) -> int:
    if text == "auto":
        return AUTO
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count of instances or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a count of instances >= 0 or 'auto', got {value}")
    return value
