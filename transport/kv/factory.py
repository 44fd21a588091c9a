"""make_data_plane: a DataPlane by backend name."""

from __future__ import annotations

from typing import Any

from dsi.transport.kv.plane import DataPlane
from dsi.transport.security import CurveKeys


def make_data_plane(
    backend: str, host: str = "127.0.0.1", keys: CurveKeys | None = None, **options: Any
) -> DataPlane:
    """``backend``: "tcp", "shm" or "rdma"; ``options`` go to the backend's constructor
    (for example ``chunk_bytes``, ``slab_bytes``; rdma: ``verbs``). Call ``await plane.start()`` next.

    ``keys``: the node's CURVE keys (``[security]``, dsi.roles.curve); with them every link of the
    plane is keyed (dsi.transport.kv.link): both ends prove their keys, every message is sealed.
    A receiving plane needs the server secret key and the allow-list (``server_keys``)."""
    if keys is not None:
        from dsi.transport.kv.linkkeys import LinkKeys

        options["keys"] = LinkKeys.from_curve(keys)
    if backend == "tcp":
        from dsi.transport.kv.tcp import TcpDataPlane

        return TcpDataPlane(host, **options)
    if backend == "shm":
        from dsi.transport.kv.shm import ShmDataPlane

        return ShmDataPlane(host, **options)
    if backend == "rdma":
        from dsi.transport.kv.rdma.plane import RdmaDataPlane

        return RdmaDataPlane(host, **options)
    raise ValueError(f"unknown data plane backend {backend!r}: tcp, shm or rdma")
