"""``dsi undrain``: cancel a drain during its grace period; the instance serves again.

    dsi undrain INSTANCE [--json] [--config configs/local.toml] [--controller tcp://HOST:PORT]

Exit 1 when the controller refuses (the grace period is over and the work is moving away, or
the instance is not draining by a ``dsi drain``) or does not answer.
"""

from __future__ import annotations

import argparse

from dsi.cli.drain import order
from dsi.cli.status import add_controller_args
from dsi.messages.control import Undrain


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("undrain", help="cancel a drain during its grace period")
    parser.add_argument("instance", metavar="INSTANCE", help="instance id, as `dsi status` lists it")
    add_controller_args(parser, timeout_s=10.0)
    parser.set_defaults(func=lambda args: order(args, "undrain", Undrain(args.instance)))
