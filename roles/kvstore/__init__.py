"""The kvstore role: KV index (TTL classes, LRU) and persistent block storage, served over RPC,
with index deltas published for CHECK replicas (see dsi.kvcache.store, dsi.kvcache.replica)."""

from dsi.roles.kvstore.actor import TOPIC, KvstoreActor

__all__ = ["TOPIC", "KvstoreActor"]
