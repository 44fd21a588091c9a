"""FakeFabric: in-memory RDMA devices in one process, for tests of the whole rdma protocol.

Each ``device()`` is a :class:`~.verbs.Verbs`. Memory regions are real host memory; a WRITE WITH
IMMEDIATE checks the rkey and bounds like a NIC (remote access error otherwise), copies with
``memmove``, consumes one posted receive on the target queue pair (receiver-not-ready error if none)
and completes on both sides; completions wake the plane through a pipe, like a completion channel.
Like a NIC's send queue, a queue pair takes at most ``send_depth`` work requests whose completions
have not been polled yet; one more fails the post (ENOMEM).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import mmap
import os
from collections import deque

from dsi.transport.kv.rdma.verbs import Completion, MemoryRegion, QpInfo


class FakeFabric:
    """Devices that can reach each other; queue pair numbers and keys are unique across it."""

    def __init__(self, max_msg_bytes: int = 1 << 20, send_depth: int = 64) -> None:
        self.max_msg_bytes = max_msg_bytes
        self.send_depth = send_depth
        self._numbers = itertools.count(1)
        self.qps: dict[int, _Qp] = {}
        self.regions: dict[int, tuple[FakeDevice, MemoryRegion]] = {}  # rkey -> owner, region

    def device(self) -> FakeDevice:
        return FakeDevice(self)

    def number(self) -> int:
        return next(self._numbers)


class _Qp:
    def __init__(self, device: FakeDevice, qpn: int) -> None:
        self.device = device
        self.qpn = qpn
        self.remote: int | None = None
        self.recvs: deque[int] = deque()
        self.unpolled_sends = 0  # send work requests posted whose completions were not polled yet


class FakeDevice:
    def __init__(self, fabric: FakeFabric) -> None:
        self.fabric = fabric
        self.max_msg_bytes = fabric.max_msg_bytes
        self.send_depth = fabric.send_depth
        self._completions: deque[Completion] = deque()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._maps: dict[int, mmap.mmap] = {}

    def register(self, nbytes: int) -> MemoryRegion:
        memory = mmap.mmap(-1, max(nbytes, 1))
        addr = ctypes.addressof(ctypes.c_char.from_buffer(memory))
        key = self.fabric.number()
        mr = MemoryRegion(addr, nbytes, key, key, memoryview(memory)[:nbytes], memory)
        self.fabric.regions[key] = (self, mr)
        return mr

    def deregister(self, mr: MemoryRegion) -> None:
        self.fabric.regions.pop(mr.rkey, None)
        mr.view.release()

    def create_qp(self) -> QpInfo:
        qpn = self.fabric.number()
        self.fabric.qps[qpn] = _Qp(self, qpn)
        return QpInfo(qpn, 0, qpn.to_bytes(16, "big"))

    def connect(self, qpn: int, remote: QpInfo) -> None:
        self.fabric.qps[qpn].remote = remote.qpn

    def destroy_qp(self, qpn: int) -> None:
        self.fabric.qps.pop(qpn, None)

    def post_recv(self, qpn: int, wr_id: int) -> None:
        self.fabric.qps[qpn].recvs.append(wr_id)

    def post_write_imm(
        self,
        qpn: int,
        wr_id: int,
        local: MemoryRegion,
        offset: int,
        length: int,
        remote_addr: int,
        rkey: int,
        imm: int,
    ) -> None:
        if length > self.max_msg_bytes:
            raise ValueError(f"message of {length} bytes over the {self.max_msg_bytes}-byte limit")
        qp = self.fabric.qps[qpn]
        if qp.unpolled_sends >= self.send_depth:
            raise OSError(errno.ENOMEM, f"send queue of queue pair {qpn} is full ({self.send_depth})")
        qp.unpolled_sends += 1
        peer = self.fabric.qps.get(qp.remote) if qp.remote is not None else None
        owner = self.fabric.regions.get(rkey)
        if peer is None:
            self._complete(
                Completion(wr_id, qpn, False, False, error="queue pair not connected or peer gone")
            )
            return
        if (
            owner is None
            or owner[0] is not peer.device
            or not (owner[1].addr <= remote_addr and remote_addr + length <= owner[1].addr + owner[1].length)
        ):
            self._complete(Completion(wr_id, qpn, False, False, error="remote access error"))
            return
        if not peer.recvs:
            self._complete(Completion(wr_id, qpn, False, False, error="receiver not ready"))
            return
        ctypes.memmove(remote_addr, local.addr + offset, length)
        peer.device._complete(Completion(peer.recvs.popleft(), peer.qpn, True, True, imm))
        self._complete(Completion(wr_id, qpn, False, True))

    def poll(self) -> list[Completion]:
        out = list(self._completions)
        self._completions.clear()
        for completion in out:
            qp = self.fabric.qps.get(completion.qpn)
            if not completion.recv and qp is not None:
                qp.unpolled_sends -= 1
        return out

    def fileno(self) -> int:
        return self._wake_r

    def arm(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def close(self) -> None:
        for qpn in [n for n, qp in self.fabric.qps.items() if qp.device is self]:
            self.destroy_qp(qpn)
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _complete(self, completion: Completion) -> None:
        self._completions.append(completion)
        with contextlib.suppress(BlockingIOError):  # the pipe is full: a wake-up is pending anyway
            os.write(self._wake_w, b"\0")
