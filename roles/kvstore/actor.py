"""KvstoreActor: one KV store instance. No index or block storage yet: it holds no blocks, and
answers StoreStats with zeros besides the calls every role answers (Ping, Load)."""

from __future__ import annotations

from dsi.actor import handles
from dsi.config import KvstoreOptions
from dsi.messages.kvstore import StoreStats
from dsi.roles.role import RoleActor


class KvstoreActor(RoleActor):
    def __init__(self, name: str, options: KvstoreOptions) -> None:
        super().__init__(name)
        self.store_dir = options.store_dir  # not touched until block storage exists

    @handles
    async def stats(self, msg: StoreStats) -> StoreStats:
        return StoreStats()
