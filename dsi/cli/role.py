"""``dsi-role``: run role instances of one node config in this process.

    dsi-role --config node.toml [--role ID ...] [--http-port PORT] [--drain-timeout SECONDS]
             [--log-format text|json] [--log-level debug|info|warning|error]

Without --role it runs every role of the file. Prints ``READY <role ids>`` on stdout once every
role is serving; SIGTERM or SIGINT stops them gracefully (Goodbye to the controller) and exits 0,
as does a process whose every role was drained (``dsi drain``). An entrypoint stops first: it
answers /health and new requests 503 and lets the requests in flight finish (at most its
``drain_timeout_s``, or --drain-timeout) while the other roles of the process still serve them.
The log options override ``[logging]`` for every process of the roles (an entrypoint's HTTP
workers too); an entrypoint's access log (logger ``dsi.access``) follows them.
Exit 2: the config is bad (the message names the file and the dotted key). Exit 1: a role could
not start.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import uvloop

from dsi.config import (
    ConfigError,
    NodeConfig,
    load_config,
    with_drain_timeout,
    with_http_port,
    with_logging,
    with_role_subset,
)
from dsi.logs import setup_logging
from dsi.roles.host import RoleHost, RoleStartError

log = logging.getLogger("dsi.cli.role")  # not __main__ under python -m


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsi-role", description="Run role instances of one node config.")
    parser.add_argument("--config", required=True, help="node config TOML file")
    parser.add_argument(
        "--role",
        action="append",
        default=[],
        metavar="ID",
        help="a role id of the config to run (repeatable; default: every role)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=None,
        metavar="PORT",
        help="override the HTTP port of the config's first entrypoint",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="override the entrypoints' drain_timeout_s (how long a stop waits for requests in flight)",
    )
    parser.add_argument(
        "--log-format", choices=("text", "json"), default=None, help="default: [logging] format"
    )
    parser.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="default: [logging] level",
    )
    return parser


def read_config(
    path: str, role_ids: list[str], http_port: int | None, drain_timeout_s: float | None = None
) -> NodeConfig:
    """The config of the roles to run; ConfigError for a bad file, port, drain or role id."""
    cfg = load_config(path)
    if http_port is not None:
        cfg = with_http_port(cfg, http_port)
    if drain_timeout_s is not None:
        cfg = with_drain_timeout(cfg, drain_timeout_s)
    return with_role_subset(cfg, role_ids) if role_ids else cfg


async def serve(cfg: NodeConfig) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    host = RoleHost(cfg, [role.id for role in cfg.roles])
    try:
        await host.start()
    except RoleStartError as exc:
        log.error("cannot start: %s", exc)
        return 1
    print("READY " + " ".join(role.id for role in host.roles), flush=True)
    signalled, finished = asyncio.ensure_future(stop.wait()), asyncio.ensure_future(host.finished.wait())
    await asyncio.wait((signalled, finished), return_when=asyncio.FIRST_COMPLETED)
    signalled.cancel()
    finished.cancel()
    log.info("stopping" if stop.is_set() else "every role retired (drained); stopping")
    await host.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = read_config(args.config, args.role, args.http_port, args.drain_timeout)
    except ConfigError as exc:
        print(f"dsi-role: {exc}", file=sys.stderr)
        return 2
    cfg = with_logging(cfg, args.log_format, args.log_level)
    setup_logging(cfg.logging.format, cfg.logging.level, role=",".join(role.id for role in cfg.roles))
    return uvloop.run(serve(cfg))


if __name__ == "__main__":
    sys.exit(main())
