"""The kvstore role: KV index and persistent block storage (index and storage to come)."""

from dsi.roles.kvstore.actor import KvstoreActor

__all__ = ["KvstoreActor"]
