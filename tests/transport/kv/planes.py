"""Pairs of started data planes for tests: one receives, one sends (rdma over the fake fabric)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from dsi.transport.kv import DataPlane, make_data_plane

BACKENDS = ("tcp", "shm", "rdma")


def options(backend: str, fabric: Any = None, **extra: Any) -> dict[str, Any]:
    """Plane options; for rdma a device of ``fabric`` (a new FakeFabric when None)."""
    if backend == "rdma":
        from dsi.transport.kv.rdma.fake import FakeFabric

        extra.setdefault("verbs", (fabric or FakeFabric()).device())
    return extra


@contextlib.asynccontextmanager
async def plane_pair(
    backend: str, fabric: Any = None, **extra: Any
) -> AsyncIterator[tuple[DataPlane, DataPlane]]:
    """(receiver, sender), started; both closed on exit. rdma: two devices of ``fabric``."""
    fabric_opts = options(backend, fabric)
    receiver = make_data_plane(backend, "127.0.0.1", **{**fabric_opts, **extra})
    if backend == "rdma":
        fabric_opts["verbs"] = fabric_opts["verbs"].fabric.device()
    sender = make_data_plane(backend, "127.0.0.1", **{**fabric_opts, **extra})
    await receiver.start()
    await sender.start()
    try:
        yield receiver, sender
    finally:
        await sender.close()
        await receiver.close()
