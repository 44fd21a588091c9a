"""A role's end of the KV data plane, placed by the address rule (dsi.config.addresses).

The listener binds where the role binds (every interface for a wildcard bind, never 127.0.0.1
in its place) on an ephemeral port; the targets and leases it hands out name the role's told
host, so a sender on another host reaches it.
"""

from __future__ import annotations

from typing import Any

from dsi.config import RoleAddresses
from dsi.transport.kv import DataPlane, make_data_plane


def data_plane_stats(plane: DataPlane | None) -> dict[str, Any]:
    """The data-plane fields of EngineStats for ``plane``: its told endpoint and link counters."""
    if plane is None:
        return {}
    links = plane.sessions
    if links is None:
        return {"data_address": plane.address}
    return {
        "data_address": plane.address,
        "links_accepted": links.accepted,
        "links_refused": links.refused,
        "links_rejected": links.rejected,
    }


async def start_data_plane(backend: str, addresses: RoleAddresses, **options: Any) -> DataPlane:
    """A started ``backend`` data plane ("tcp", "shm" or "rdma") of a role with ``addresses``;
    ``options`` go to ``make_data_plane``."""
    plane = make_data_plane(backend, addresses.bind_host, **options)
    await plane.start()
    plane.address = addresses.told(plane.address)  # what expect() puts in every KvTarget
    return plane
