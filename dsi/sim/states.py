"""SWA ring snapshots: which block boundaries an exact hit can load the SWA state of.

In dsi a request that ends keeps the producer SWA state at its last block boundary in the memory
of the host that made it (``dsi.roles.state_cache``), under the chain key of the block that ends
there; a later prefill whose hit ends at that boundary pulls it and takes an exact hit
(``dsi.engine.hit_policy.choose_hit``). A request served with a bounded-replay hit announces no
state. Here one LRU of ``capacity`` snapshots (0 = unbounded) stands for all hosts together;
host failures and restarts are not modelled.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(slots=True)
class RingSnapshots:
    capacity: int = 0
    _held: OrderedDict[bytes, float] = field(default_factory=OrderedDict)

    def announce(self, key: bytes, now: float) -> None:
        """The state at the end of the block whose chain key is ``key``, made at ``now``."""
        self._held[key] = now
        self._held.move_to_end(key)
        if self.capacity and len(self._held) > self.capacity:
            self._held.popitem(last=False)

    def pull(self, key: bytes) -> bool:
        """Whether the state after block ``key`` is held (a hit counts as a use)."""
        if key not in self._held:
            return False
        self._held.move_to_end(key)
        return True

    def __len__(self) -> int:
        return len(self._held)
