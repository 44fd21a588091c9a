"""PyverbsDevice: :class:`~.verbs.Verbs` on a real RDMA device through rdma-core's pyverbs.

pyverbs ships with Debian's ``python3-pyverbs`` under /usr/lib/python3/dist-packages, outside a
virtual environment: ``import_pyverbs`` adds that folder when the plain import fails, and the dsi
package imports without it (only ``open_device`` needs it).

Not exercised on this machine (no RDMA device): ``tests/transport/kv/test_rdma_device.py`` runs
against a device where ``ibv_get_device_list`` finds one. GPU memory: a CUDA tensor is registered
with ``ibv_reg_dmabuf_mr`` (pyverbs ``DmaBufMR(pd, length, access, dmabuf)``) from the dma-buf fd
that ``cuMemGetHandleForAddressRange`` exports, so the NIC writes into GPU memory (GPUDirect RDMA);
``register_dmabuf`` below is that path.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from typing import Any

from dsi.transport.kv.rdma.verbs import Completion, MemoryRegion, QpInfo

DEBIAN_DIST = "/usr/lib/python3/dist-packages"
PORT = 1
GID_INDEX = 0
CQ_DEPTH = 4096
SEND_DEPTH = 256
RECV_DEPTH = 2048


def import_pyverbs() -> Any:
    """The pyverbs package; ImportError with the reason when it is missing."""
    try:
        return importlib.import_module("pyverbs")
    except ImportError:
        if DEBIAN_DIST not in sys.path:
            sys.path.append(DEBIAN_DIST)
        return importlib.import_module("pyverbs")


def device_names() -> list[str]:
    """RDMA devices present (empty when pyverbs or the devices are missing)."""
    try:
        import_pyverbs()
        from pyverbs.device import get_device_list

        return [d.name.decode() for d in get_device_list()]
    except Exception:  # no pyverbs, no libibverbs, or rdma-core's "Failed to get devices list"
        return []


def open_device(name: str | None = None) -> PyverbsDevice:
    names = device_names()
    if not names:
        raise RuntimeError("no RDMA device: ibv_get_device_list is empty (or pyverbs is not installed)")
    return PyverbsDevice(name or names[0])


class PyverbsDevice:
    """One device context, protection domain, completion channel and shared completion queue."""

    def __init__(self, name: str) -> None:
        import_pyverbs()
        from pyverbs.cq import CQ, CompChannel
        from pyverbs.device import Context
        from pyverbs.pd import PD

        self.ctx = Context(name=name)
        self.pd = PD(self.ctx)
        self.channel = CompChannel(self.ctx)
        self.cq = CQ(self.ctx, CQ_DEPTH, None, self.channel, 0)
        self.cq.req_notify()
        self.max_msg_bytes = self.ctx.query_port(PORT).max_msg_sz
        self.send_depth = SEND_DEPTH
        self._lid = self.ctx.query_port(PORT).lid
        self._gid = self.ctx.query_gid(PORT, GID_INDEX)
        self._qps: dict[int, Any] = {}

    def register(self, nbytes: int) -> MemoryRegion:
        from pyverbs.mr import MR

        mr = MR(self.pd, max(nbytes, 1), _access())
        view = memoryview((ctypes.c_char * max(nbytes, 1)).from_address(mr.buf)).cast("B")[:nbytes]
        return MemoryRegion(mr.buf, nbytes, mr.lkey, mr.rkey, view, mr)

    def register_dmabuf(self, fd: int, offset: int, nbytes: int, addr: int) -> MemoryRegion:
        """GPU memory exported as a dma-buf (``fd``); ``view`` is empty: the CPU cannot read it."""
        from pyverbs.mr import DmaBufMR

        mr = DmaBufMR(self.pd, nbytes, _access(), fd=fd, offset=offset, iova=addr)
        return MemoryRegion(addr, nbytes, mr.lkey, mr.rkey, memoryview(b""), mr)

    def deregister(self, mr: MemoryRegion) -> None:
        mr.view.release()
        mr.handle.close()  # type: ignore[union-attr]

    def create_qp(self) -> QpInfo:
        from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr

        cap = QPCap(max_send_wr=SEND_DEPTH, max_recv_wr=RECV_DEPTH, max_send_sge=1, max_recv_sge=1)
        qp = QP(self.pd, QPInitAttr(qp_type=_e().IBV_QPT_RC, scq=self.cq, rcq=self.cq, cap=cap))
        attr = QPAttr(port_num=PORT)
        attr.qp_access_flags = _access()
        qp.to_init(attr)
        self._qps[qp.qp_num] = qp
        return QpInfo(qp.qp_num, self._lid, self._gid.gid.encode("ascii"))  # pyverbs' "fe80:0000:..." text

    def connect(self, qpn: int, remote: QpInfo) -> None:
        from pyverbs.addr import GID, AHAttr, GlobalRoute
        from pyverbs.qp import QPAttr

        gid = GID()
        gid.gid = remote.gid.decode("ascii")
        attr = QPAttr(port_num=PORT)
        attr.path_mtu = _e().IBV_MTU_4096
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = attr.sq_psn = 0
        attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
        attr.min_rnr_timer = 12
        attr.timeout, attr.retry_cnt, attr.rnr_retry = 14, 7, 7
        attr.ah_attr = AHAttr(
            gr=GlobalRoute(dgid=gid, sgid_index=GID_INDEX), is_global=1, dlid=remote.lid, port_num=PORT
        )
        qp = self._qps[qpn]
        qp.to_rtr(attr)
        qp.to_rts(attr)

    def destroy_qp(self, qpn: int) -> None:
        qp = self._qps.pop(qpn, None)
        if qp is not None:
            qp.close()

    def post_recv(self, qpn: int, wr_id: int) -> None:
        from pyverbs.wr import RecvWR

        self._qps[qpn].post_recv(RecvWR(wr_id=wr_id, num_sge=0))

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
        from pyverbs.wr import SGE, SendWR

        wr = SendWR(
            wr_id=wr_id,
            opcode=_e().IBV_WR_RDMA_WRITE_WITH_IMM,
            num_sge=1,
            sg=[SGE(local.addr + offset, length, local.lkey)],
            send_flags=_e().IBV_SEND_SIGNALED,
            imm_data=imm,
        )
        wr.set_wr_rdma(rkey, remote_addr)
        self._qps[qpn].post_send(wr)

    def poll(self) -> list[Completion]:
        e = _e()
        count, wcs = self.cq.poll(64)
        out = []
        for wc in wcs[:count]:
            recv = wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM
            ok = wc.status == e.IBV_WC_SUCCESS
            out.append(
                Completion(
                    wc.wr_id,
                    wc.qp_num,
                    recv,
                    ok,
                    wc.imm_data if recv else 0,
                    "" if ok else f"work completion status {wc.status}",
                )
            )
        return out

    def fileno(self) -> int:
        return self.channel.fd

    def arm(self) -> None:
        """Called when the channel fd is readable, so the event read here does not block."""
        self.channel.get_cq_event(self.cq)
        self.cq.ack_events(1)
        self.cq.req_notify()

    def close(self) -> None:
        for qpn in list(self._qps):
            self.destroy_qp(qpn)
        self.cq.close()
        self.channel.close()
        self.pd.close()
        self.ctx.close()


def _e() -> Any:
    import pyverbs.enums as enums

    return enums


def _access() -> int:
    e = _e()
    return e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
