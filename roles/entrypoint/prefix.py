"""PrefixLookup: how many leading prompt tokens the kvstore holds, known before routing.

    token ids --HashChain.of(model, root_seed)--> packed hashes of the full blocks (block_size tokens)
              --CheckReplica.match (local key set, no I/O)--> hit blocks x block_size = cached tokens

The hashes must be those the engine gives its pages (the engine's ``EngineShape.hash_chain``:
``HashChain.of(model config, root_seed)``), so a block persisted by any decode instance is found here.
vLLM instances hash on a chain versioned by their fingerprint (dsi.vllm.chain): with a
controller, the lookup asks it for the serving engine instances every ``refresh_s`` and hashes on
the chain most of them use.
The replica follows the kvstore the controller lists (role "kvstore"), or a fixed ``address``
(the controller, where there is one, is still asked for the engines' chain);
with no kvstore, or until the first snapshot is loaded, every lookup is a miss. A replica that
lost its kvstore keeps answering from its last state: a stale hit costs the prefill a fetch
miss, never wrong data.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence

import numpy as np
import zmq.asyncio

from dsi.errors import DsiError
from dsi.kvcache.hashchain import HashChain
from dsi.kvcache.replica import CheckReplica
from dsi.messages import ALL
from dsi.messages.control import ListInstances
from dsi.roles.kvstore.client import kvstore_address
from dsi.transport.client import Peer
from dsi.transport.security import CurveKeys
from dsi.vllm.chain import majority_chain

log = logging.getLogger(__name__)


class PrefixLookup:
    """``refresh_s``: how often the controller is asked where the kvstore is."""

    def __init__(
        self,
        chain: HashChain,
        controller: str | None,
        ctx: zmq.asyncio.Context,
        *,
        address: str | None = None,
        keys: CurveKeys | None = None,
        peer_id: str = "entrypoint",
        refresh_s: float = 2.0,
        silence_s: float = 5.0,
        timeout: float = 5.0,
        vllm_model: str | None = None,
        vllm_block_size: int = 128,
    ) -> None:
        self.chain = chain
        self.default_chain = chain  # dsi's engines' chain; ``chain`` follows the serving engines
        self._vllm_model = chain.model if vllm_model is None else vllm_model  # as vLLM roles name it
        self._vllm_block_size = vllm_block_size
        self.replica: CheckReplica | None = None
        self._fixed = address
        self._ctx, self._peer_id, self._keys = ctx, peer_id, keys
        self._refresh_s, self._silence_s, self._timeout = refresh_s, silence_s, timeout
        self._controller = (
            Peer(controller, ctx, types=ALL, peer_id=peer_id, role="entrypoint", keys=keys, timeout=2.0)
            if controller is not None
            else None
        )
        self._address: str | None = None
        self._task: asyncio.Task | None = None

    @property
    def address(self) -> str | None:
        return self._address

    async def start(self) -> None:
        """Follow the kvstore in the background; lookups are misses until the replica is synced."""
        if self._fixed is None and self._controller is None:
            return  # no kvstore: off
        self._task = asyncio.get_running_loop().create_task(self._keep_following(), name="prefix-lookup")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.replica is not None:
            await self.replica.stop()
        if self._controller is not None:
            await self._controller.close()

    def cached_tokens(
        self, token_ids: Sequence[int], cache_salt: str = "", extras: Mapping[int, bytes] | None = None
    ) -> int:
        """Leading tokens of the prompt in full blocks the kvstore holds (a multiple of the block
        size). As in the engine, the last prompt token is always computed: a prompt of exactly n
        blocks can hit n - 1 of them. ``extras``: the blocks' extra keys (image digests, see
        ``image_extras``)."""
        replica, bs = self.replica, self.chain.block_size
        full = max(0, len(token_ids) - 1) // bs * bs
        if replica is None or not replica.state.synced or not full:
            return 0
        # array.array converts a list of ints several times faster than numpy does.
        ids = np.frombuffer(array.array("I", token_ids[:full]), dtype=np.uint32)
        return replica.match(self.chain.hashes(ids, cache_salt=cache_salt, extras=extras or None)) * bs

    def metric_lines(self) -> list[str]:
        """The replica's gauges in the Prometheus text format."""
        state = self.replica.state if self.replica is not None else None
        values = {
            "blocks": len(state.keys) if state else 0,
            "seq": state.seq if state else 0,
            "synced": int(state.synced) if state else 0,
        }
        lines = []
        for name, value in values.items():
            lines += [f"# TYPE dsi_kv_replica_{name} gauge", f"dsi_kv_replica_{name} {value}"]
        lines += [
            "# TYPE dsi_kv_replica_resyncs_total counter",
            f"dsi_kv_replica_resyncs_total {state.resyncs if state else 0}",
        ]
        return lines

    # ---- internals ---------------------------------------------------------------------------
    async def _keep_following(self) -> None:
        if self._controller is not None:
            with contextlib.suppress(DsiError):
                await self._controller.connect()
        while True:
            address = self._fixed
            if self._controller is not None:
                listed = await self._ask_controller()
                address = listed if self._fixed is None else self._fixed
            if address is not None and (address != self._address or self.replica is None):
                await self._follow(address)
            await asyncio.sleep(self._refresh_s)

    async def _ask_controller(self) -> str | None:
        """One instance table: the kvstore to follow, and the chain most serving engine instances
        use (see dsi.vllm.chain) to hash on."""
        try:
            table = await self._controller.ask(ListInstances(), timeout=2.0)  # type: ignore[union-attr]
        except DsiError as exc:
            log.debug("prefix lookup: controller not reachable: %s", exc)
            return None
        d = self.default_chain
        chain = majority_chain(d, table.instances, d.root_seed, self._vllm_model, self._vllm_block_size)
        if chain != self.chain:
            log.info("prefix lookup: hashing on chain %r (the serving engines')", chain.version or d.model)
            self.chain = chain
        return kvstore_address(table.instances)

    async def _follow(self, address: str) -> None:
        """Replace the replica with one of the kvstore at ``address`` (kept only once it synced)."""
        replica = CheckReplica(
            address,
            self._ctx,
            timeout=self._timeout,
            silence_s=self._silence_s,
            peer_id=f"{self._peer_id}.replica",
            keys=self._keys,
        )
        try:
            await replica.start(self._timeout)
        except (DsiError, TimeoutError, zmq.ZMQError) as exc:
            log.info("prefix lookup: kvstore at %s not reachable yet: %s", address, exc)
            await replica.stop()
            return
        except BaseException:  # cancelled by close()
            await replica.stop()
            raise
        old, self.replica, self._address = self.replica, replica, address
        if old is not None:
            await old.stop()
        log.info("prefix lookup: following the kvstore at %s (%d blocks)", address, len(replica.state.keys))
