"""Entrypoint -> decode -> prefill: the disaggregated request, its KV lease and the handoff.

The entrypoint picks a prefill and a decode instance and streams from the decode; the decode
holds the lease, so the memory a transfer lands in always belongs to the side that reserves it::

    entrypoint                 decode                                   prefill
      |-- Handoff ------------->|  reserve pages + a state slot, expect a transfer (a lease)
      |                         |-- PrefillStream(request, KvLease) ---->|  store hits, prefill
      |<-- TokenChunk (first) --|<------------------------ FirstToken ---|  the first token, at once
      |                         |<========= data plane: pages + state ====|  export, written into the lease
      |                         |<------------------------- Prefilled ----|  counters
      |<-- TokenChunk* ---------|  import into the reserved pages, decode, stream

``PrefillStream`` is answered by a stream: ``FirstToken`` as soon as the prompt's first token is
sampled (when the request goes on), so the client has it while the export and the write run,
then ``Prefilled`` once the decode has every byte. ``PrefillTo`` is the same call answered once,
with ``Prefilled`` only (what vLLM-backed prefills serve). A failure after the first token went
out is retried like any other: the entrypoint re-runs the request and checks that the re-run
reproduces the tokens the client has (dsi.roles.entrypoint.recovery).

A lease not completed within ``expires_in_s`` is released (pages, slot, receive region), so a
dead prefill never strands decode memory; the prefill frees its copy when the send ends either
way, so a dead decode never strands prefill memory. A failed prefill reaches the entrypoint as
``PrefillLost`` before any token, and it retries on another prefill instance.
"""

from __future__ import annotations

from dsi.engine.hit_policy import HitChoice
from dsi.errors import DsiError, register_error
from dsi.messages.base import Message
from dsi.messages.gateway import Generate


class KvLease(Message):
    """Where the prefill writes: a receive region on the decode's data plane, valid for a while."""

    lease_id: str  # also the data-plane transfer id: names + 128 random bits (dsi.transport.kv.ids)
    backend: str  # tcp | shm | rdma
    address: str  # the decode's data-plane endpoint
    nbytes: int  # exactly the RequestState bytes of ``num_blocks`` pages
    num_blocks: int
    expires_in_s: float
    region: bytes = b""  # backend-specific descriptor of the receive region


class Handoff(Message):
    """Entrypoint -> decode: serve ``request`` with its prompt prefilled on ``prefill``."""

    request: Generate
    prefill: str  # control-plane address of the chosen prefill instance
    prefill_id: str = ""


class PrefillTo(Message):
    """Decode -> prefill: prefill ``request`` and write its KV + state into ``lease``."""

    request: Generate
    lease: KvLease


class PrefillStream(Message):
    """Decode -> prefill: as ``PrefillTo``, answered by a stream: ``FirstToken`` (unless the
    first token ends the request), then ``Prefilled``."""

    request: Generate
    lease: KvLease


class FirstToken(Message):
    """Prefill -> decode, first in a ``PrefillStream``: the prompt's first token, sent before
    the KV is exported and written."""

    lease_id: str
    output: list[int]  # sampled tokens (normally just the first one)
    logprobs: list[float]
    cached_tokens: int = 0  # positions loaded from the store (H)
    top_logprobs: list[list[tuple[int, float]]] = []  # per token of ``output`` when the request asked
    hit: HitChoice | None = None  # the prefix hit taken


class Prefilled(Message):
    """Prefill -> decode, after the data-plane write completed: how to continue the request."""

    lease_id: str
    output: list[int]  # sampled tokens (normally just the first one)
    logprobs: list[float]
    seed: int  # the effective sampling seed
    consumer_start: int
    num_computed: int  # prompt positions whose cache the lease now holds
    cached_tokens: int = 0  # positions loaded from the store (H)
    replay_tokens: int = 0  # positions recomputed only to rebuild SWA rings
    replay_start: int = 0  # R: where the producer SWA keys of a hit start (engine semantics)
    finish: str = ""  # set when the first token already ended the request: nothing was written
    top_logprobs: list[list[tuple[int, float]]] = []  # per token of ``output`` when the request asked
    hit: HitChoice | None = None  # the prefix hit taken (None: not reported)


class PullState(Message):
    """Prefill -> the engine instance that announced a block's SWA state: write it into ``lease``
    (its bytes: the producer ring snapshot ``[n_producer, 2, block_size, n_kv_heads, head_dim]`` fp32)."""

    block_hash: bytes
    lease: KvLease


class StatePulled(Message):
    boundary: int  # the block boundary (tokens) the state belongs to


class GetEngineStats(Message):
    pass


class EngineStats(Message):
    """Memory an engine role holds, for operators and for tests that check nothing leaks."""

    total_blocks: int = 0
    free_blocks: int = 0
    total_slots: int = 0
    free_slots: int = 0
    running: int = 0
    leases: int = 0  # live decode leases
    regions: int = 0  # live data-plane receive regions
    cached_tokens: int = 0  # prompt positions loaded from the store, since start
    replay_tokens: int = 0
    computed_prompt_tokens: int = 0
    persisted_blocks: int = 0  # full pages sent to the store
    prefills: int = 0
    handoffs: int = 0
    failed_handoffs: int = 0
    states_kept: int = 0  # SWA states in this host's cache
    states_pulled: int = 0  # hits served exactly with a pulled SWA state (no replay)
    states_served: int = 0  # states this host sent to others
    migrated_in: int = 0  # requests taken over from a draining decode (imported here)
    migrated_out: int = 0  # requests this decode moved away while draining
    precopied_pages: int = 0  # full pages received here before a switch (live migration pre-copy)
    local_hit_tokens: int = 0  # prompt positions found in the engine's own prefix cache (vLLM), since start
    store_fetched_blocks: int = 0  # pages fetched from the store for the engine to load (vLLM)
    store_skipped_blocks: int = 0  # pages not looked up: the engine's own prefix cache held them (vLLM)
    resumed: int = 0  # re-runs continued after the tokens the client had, not decoded again (vLLM)
    data_address: str = ""  # the data plane's endpoint, as senders are told it
    links_accepted: int = 0  # keyed data plane, since start: senders that proved an allowed key
    links_refused: int = 0  # frames dropped: a handshake that proved nothing, or from no session
    links_rejected: int = 0  # links closed for a record that failed to open


class PrefillLost(DsiError):
    """The prefill instance failed or vanished before the KV arrived; retry on another one."""

    code = "prefill_lost"


register_error(PrefillLost)


class StateMissing(DsiError):
    """The engine instance no longer holds that SWA state (evicted); replay instead."""

    code = "state_missing"


register_error(StateMissing)


class HitUnavailable(DsiError):
    """A re-run is pinned to a prefix hit (``Generate.pin_hit``) that can no longer be taken and
    that no other hit reproduces: its tokens would not be the ones the client already has."""

    code = "hit_unavailable"


register_error(HitUnavailable)

HandoffMsg = (
    KvLease
    | Handoff
    | PrefillTo
    | PrefillStream
    | FirstToken
    | Prefilled
    | PullState
    | StatePulled
    | GetEngineStats
    | EngineStats
)
HANDOFF = (
    KvLease,
    Handoff,
    PrefillTo,
    PrefillStream,
    FirstToken,
    Prefilled,
    PullState,
    StatePulled,
    GetEngineStats,
    EngineStats,
)
