"""LocalBlocks: which of dsi's pages one vLLM instance holds in its own prefix cache, from vLLM's
KV events.

vLLM publishes what its block pool caches and evicts (``kv_events_config``: a ZeroMQ PUB socket,
frames ``topic | seq (8 bytes, big-endian) | msgpack batch``). A batch is ``[ts, events, dp_rank]``;
each event is a map tagged by ``type``:

    BlockStored      block_hashes, parent_block_hash, token_ids, block_size, extra_keys, ...
    BlockRemoved     block_hashes, ...
    AllBlocksCleared

vLLM names blocks by its own hashes, seeded per process; dsi names pages by its hash chain
(dsi.kvcache.hashchain). A stored block is translated by chaining its tokens onto its parent's
dsi hash (the chain's root, salted by the request's cache salt, for a first block), so the index
answers in dsi's hashes: ``held(hashes)`` is how many leading pages of a prompt vLLM would find
locally. A block whose parent is unknown (events lost, or keys dsi does not hash, such as images
or LoRA) is left out: the index may know less than vLLM holds, never more than it held, so a
wrong answer costs a store fetch or a recomputation, never wrong KV.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dsi.kvcache.hashchain import HASH_BYTES, HashChain

log = logging.getLogger(__name__)

_decode = msgspec.msgpack.Decoder()


@dataclass(slots=True)
class LocalBlocks:
    """dsi page hashes of the blocks one vLLM instance caches (see the module docstring).

    ``seq``: the last batch sequence number applied (-1 before any); ``gaps`` counts batches that
    went missing between two received (the index then misses blocks until they are stored again).
    """

    chain: HashChain
    seq: int = -1
    gaps: int = 0
    _dsi: dict[Hashable, bytes] = field(default_factory=dict)  # vLLM block hash -> dsi hash
    _held: dict[bytes, int] = field(default_factory=dict)  # dsi hash -> vLLM blocks naming it

    def __len__(self) -> int:
        return len(self._held)

    def held(self, hashes: Sequence[bytes]) -> int:
        """How many leading ``hashes`` (a prompt's dsi page hashes, in chain order) are held."""
        n = 0
        for h in hashes:
            if h not in self._held:
                break
            n += 1
        return n

    def receive(self, frames: Sequence[bytes]) -> None:
        """Apply one message of vLLM's publisher (``topic, seq, payload``); a malformed message is
        logged and dropped."""
        try:
            seq = int.from_bytes(frames[1], "big", signed=True)
            batch = _decode.decode(frames[2])
            events = batch[1]
        except (IndexError, TypeError, ValueError, msgspec.DecodeError) as exc:
            log.warning("vLLM KV event dropped: %s", exc)
            return
        if self.seq >= 0 and seq > self.seq + 1:
            self.gaps += seq - self.seq - 1
        self.seq = seq
        for event in events:
            self.apply(event)

    def apply(self, event: Any) -> None:
        """One decoded event (a map with ``type``)."""
        if not isinstance(event, dict):
            return
        kind = event.get("type")
        if kind == "BlockStored":
            self._stored(event)
        elif kind == "BlockRemoved":
            for h in event.get("block_hashes") or ():
                self._forget(_key(h))
        elif kind == "AllBlocksCleared":
            self._dsi.clear()
            self._held.clear()

    def _stored(self, event: dict) -> None:
        hashes = [_key(h) for h in event.get("block_hashes") or ()]
        tokens = event.get("token_ids") or []
        size = int(event.get("block_size") or 0)
        extras = event.get("extra_keys") or [None] * len(hashes)
        if size != self.chain.block_size or len(tokens) != size * len(hashes) or len(extras) != len(hashes):
            return
        parent_key = event.get("parent_block_hash")
        parent = None if parent_key is None else self._dsi.get(_key(parent_key))
        if parent_key is not None and parent is None:
            return  # its parent was never seen: unknown chain
        for i, vh in enumerate(hashes):
            keys = extras[i]
            salt = ""
            if keys:
                if parent is None and len(keys) == 1 and isinstance(keys[0], str):
                    salt = keys[0]  # a first block's cache salt
                else:
                    return  # images, LoRA, embeddings: keys dsi's chain does not hash here
            block = tokens[i * size : (i + 1) * size]
            try:
                h = self.chain.hashes(block, cache_salt=salt, parent=parent)
            except (ValueError, OverflowError):
                return
            if len(h) != HASH_BYTES:
                return
            if self._dsi.get(vh) != h:
                self._forget(vh)
                self._dsi[vh] = h
                self._held[h] = self._held.get(h, 0) + 1
            parent = h

    def _forget(self, vllm_hash: Hashable) -> None:
        h = self._dsi.pop(vllm_hash, None)
        if h is None:
            return
        left = self._held.get(h, 0) - 1
        if left > 0:
            self._held[h] = left
        else:
            self._held.pop(h, None)


def _key(h: Any) -> Hashable:
    """vLLM's hashes arrive as bytes or ints (its ``ExternalBlockHash``); lists are made hashable."""
    return tuple(h) if isinstance(h, list) else h


async def follow(local: LocalBlocks, ctx: Any, endpoint: str, topic: str = "") -> None:
    """Apply every message vLLM's publisher sends on ``endpoint`` to ``local``, until cancelled.
    ``ctx``: a ``zmq.asyncio.Context``."""
    import zmq

    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, topic)
    sub.connect(endpoint)
    try:
        while True:
            local.receive(await sub.recv_multipart())
    finally:
        sub.close()
