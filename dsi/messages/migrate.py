"""Decode -> decode: live migration of running requests when an instance drains.

``dsi drain`` asks the controller, which marks the instance ``draining`` (the gateway sends it
no new work) and passes the order on; during the grace period the draining decode pre-copies
every full page of its running requests to the decodes that will take them over, while they
keep decoding; at the end of it one batch moves the rest::

    draining decode (A)                                  target decode (B)
      |-- Precopy([request, start, count]...) ----------->|  reserve (or grow) pages + a slot, expect
      |<--------------------------------- MigrationLeases |
      |========= data plane: full pages start..start+count ==>|  written into the reservation
      |   ... again for the pages that filled since, until the grace period ends ...
      |   export every request between two steps (without the pages B holds)
      |-- MigrateIn([Migrant]...) ----------------------->|  grow the reservation, expect the tail
      |<--------------------------------- MigrationLeases |
      |========= data plane: the tail pages + SWA rings + compressor partial ==>|  import, decode
      |-- TokenChunk(finish="migrated", moved_to=B) -->  entrypoint
                                                 entrypoint -- Resume(request_id) -->|  the stream goes on

B keeps what it received for ``expires_in_s`` without a follow-up (A died, or the drain was
cancelled without a ``MigrateCancel`` reaching it): reservations and receive regions are
released. The first chunk of a resumed stream repeats every output token so far; the
entrypoint checks it against what it delivered (:mod:`dsi.roles.entrypoint.recovery`) and
streams only what is new.
"""

from __future__ import annotations

from dsi.engine.params import SamplingParams
from dsi.messages.base import Message
from dsi.messages.handoff import KvLease


class PrecopyPage(Message):
    """Full pages ``start .. start + count`` of one request."""

    request_id: str
    start: int
    count: int


class Precopy(Message):
    """A -> B: expect these full pages (one data-plane transfer each, answered in order)."""

    pages: list[PrecopyPage]
    expires_in_s: float = 30.0


class Migrant(Message):
    """One exported request, the tail of its cache travelling on the data plane.

    The tail is a RequestState buffer with ``num_blocks`` pages (those after the ``held`` that B
    already holds from ``Precopy``), the SWA rings and the compressor partial state."""

    request_id: str
    prompt: list[int]
    output: list[int]  # every token so far (some may not have reached the client yet)
    logprobs: list[float]
    sampling: SamplingParams
    seed: int
    consumer_start: int
    num_computed: int
    num_cached: int
    replay_start: int
    held: int  # leading pages pre-copied to B
    num_blocks: int  # pages in the tail
    traffic_class: str = "chatbot"
    cached_tokens: int = 0  # what the request's chunks report (its prefix hit)
    images: list[tuple[int, int, bytes]] = []  # (offset, tokens, digest) of the prompt's images


class MigrateIn(Message):
    """A -> B: take these requests over."""

    migrants: list[Migrant]
    expires_in_s: float = 30.0


class MigrationLeases(Message):
    """B -> A: where to write, one lease per page range or migrant, in order."""

    leases: list[KvLease]


class MigrateCancel(Message):
    """A -> B: the drain was cancelled; release what was pre-copied for these requests."""

    request_ids: list[str]


class Resume(Message):
    """Entrypoint -> B: stream a migrated request from here (TokenChunk items)."""

    request_id: str


class DrainOrder(Message):
    """Controller -> instance: drain after ``grace_s`` seconds (``cancel``: an undrain)."""

    grace_s: float = 60.0
    cancel: bool = False


MigrateMsg = (
    PrecopyPage | Precopy | Migrant | MigrateIn | MigrationLeases | MigrateCancel | Resume | DrainOrder
)
MIGRATE = (PrecopyPage, Precopy, Migrant, MigrateIn, MigrationLeases, MigrateCancel, Resume, DrainOrder)
