"""A receiver in its own process: ``python -m tests.transport.kv.receiver_proc BACKEND NBYTES``.

Expects "warm" (4 KiB) and "big" (NBYTES), prints both targets as one hex msgpack line, then
serves until it is killed.
"""

from __future__ import annotations

import asyncio
import sys

import msgspec

from dsi.transport.kv import make_data_plane

WARM_BYTES = 4096


async def main(backend: str, nbytes: int) -> None:
    plane = make_data_plane(backend, "127.0.0.1")
    await plane.start()
    inbounds = [plane.expect("warm", WARM_BYTES, 600.0), plane.expect("big", nbytes, 600.0)]
    print(msgspec.msgpack.encode([i.target for i in inbounds]).hex(), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
