"""EmbedsCache: image embeddings by image digest, least recently used out first, bounded in
bytes. An entry stays after a prefill pulled it, so a retried prefill or a request with the
same image finds it; one that was evicted is ``ImagesMissing`` for the puller."""

from __future__ import annotations

from collections import OrderedDict

import torch


class EmbedsCache:
    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.nbytes = 0
        self._items: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, digest: bytes) -> torch.Tensor | None:
        t = self._items.get(digest)
        if t is not None:
            self._items.move_to_end(digest)
        return t

    def put(self, digest: bytes, embeds: torch.Tensor) -> None:
        """Keep ``embeds`` [tokens, hidden] fp32; older entries leave to stay within capacity."""
        old = self._items.pop(digest, None)
        if old is not None:
            self.nbytes -= old.nbytes
        self._items[digest] = embeds
        self.nbytes += embeds.nbytes
        while self.nbytes > self.capacity_bytes and len(self._items) > 1:
            _, gone = self._items.popitem(last=False)
            self.nbytes -= gone.nbytes
