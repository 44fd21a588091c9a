"""A process that serves EchoActor, for tests that kill, restart or fuzz a real role.

    python -m tests.transport.echo_server --bind tcp://127.0.0.1:PORT [--curve-dir DIR]

Prints ``READY <address>`` on stdout once bound; SIGTERM stops the actor (pending callers get
ActorStopped), closes the socket and exits with status 0. ``--curve-dir`` is a directory made by
``transport.security.generate_keys``.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

import uvloop
import zmq.asyncio

from dsi.transport.security import Authenticator, CurveKeys
from dsi.transport.server import ActorServer
from tests.transport.echo import EchoActor


def _keys(directory: Path) -> CurveKeys:
    return CurveKeys.load(
        directory / "server.key",
        directory / "clients" / "client.key_secret",
        server_secret_key=directory / "server.key_secret",
        authorized_keys_dir=directory / "authorized",
    )


async def serve(bind: str, curve_dir: Path | None) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    ctx = zmq.asyncio.Context()
    keys = _keys(curve_dir) if curve_dir is not None else None
    auth = Authenticator(ctx, keys) if keys is not None else None
    server = ActorServer(EchoActor(), bind, ctx, role="echo", keys=keys)
    await server.start()
    print(f"READY {server.address}", flush=True)
    await stop.wait()
    await server.stop()
    if auth is not None:
        auth.stop()
    ctx.term()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="ZeroMQ endpoint, e.g. tcp://127.0.0.1:5555")
    parser.add_argument("--curve-dir", type=Path, default=None, help="keys made by generate_keys")
    args = parser.parse_args(argv)
    uvloop.run(serve(args.bind, args.curve_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
