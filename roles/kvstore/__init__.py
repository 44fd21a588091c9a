"""The kvstore role: KV index (TTL classes, LRU) and persistent block storage, served over RPC,
with index deltas published for CHECK replicas (see dsi.kvcache.store, dsi.kvcache.replica)."""

from dsi.roles.kvstore.actor import TOPIC, KvstoreActor
from dsi.roles.kvstore.client import FetchedBlocks, KvstoreClient, find_kvstore

__all__ = ["TOPIC", "FetchedBlocks", "KvstoreActor", "KvstoreClient", "find_kvstore"]
