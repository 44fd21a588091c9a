"""A receiver killed with SIGKILL in the middle of a transfer: the sender fails fast, not at its timeout.

The receiver is a real process. It is stopped (SIGSTOP) after a first transfer connected both
sides, so the big transfer stalls part way, then killed (SIGKILL): the sender must raise
TransferFailed within a few seconds although its own timeout is 60 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import numpy as np
import pytest

from dsi.kvcache.shm import SHM_DIR
from dsi.transport.kv import KvTarget, TransferFailed, TransferTimeout, make_data_plane
from dsi.transport.kv.shm import PREFIX
from tests.transport.kv.receiver_proc import WARM_BYTES

REPO_ROOT = Path(__file__).resolve().parents[3]
BIG = 64 << 20
FAIL_WITHIN_S = 5.0


class Receiver:
    """The child process; ``stop`` always reaps it and removes the shm files it leaves behind."""

    def __init__(self, backend: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.transport.kv.receiver_proc", backend, str(BIG)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )

    def targets(self) -> list[KvTarget]:
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        return msgspec.msgpack.decode(bytes.fromhex(line.decode()), type=list[KvTarget])

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc.stdout.close()  # type: ignore[union-attr]
        for leftover in SHM_DIR.glob(f"{PREFIX}-{self.proc.pid}-*"):
            leftover.unlink(missing_ok=True)


@pytest.fixture
def receiver(request):
    proc = Receiver(request.param)
    yield proc
    proc.stop()


@pytest.mark.parametrize("receiver", ["tcp", "shm"], indirect=True)
async def test_sigkill_mid_transfer_fails_the_sender_fast(receiver):
    warm, big = await asyncio.to_thread(receiver.targets)
    sender = make_data_plane(warm.backend, "127.0.0.1", chunk_bytes=1 << 20)
    await sender.start()
    try:
        await sender.send(warm, [bytes(WARM_BYTES)], 30.0)
        receiver.signal(signal.SIGSTOP)
        task = asyncio.create_task(sender.send(big, [np.ones(BIG, np.uint8)], 60.0))
        await asyncio.sleep(0.3)
        assert not task.done()
        receiver.signal(signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises((TransferFailed, TransferTimeout)):
            await asyncio.wait_for(task, FAIL_WITHIN_S + 5)
        assert time.monotonic() - started < FAIL_WITHIN_S
        assert sender.stats.failed == 1
    finally:
        await sender.close()
