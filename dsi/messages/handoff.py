"""Prefill <-> decode: leases for KV blocks and state slots, and the handoff itself.

    prefill                      decode
      |-- ReserveKv ------------->|   reserve blocks + a state slot under a lease
      |<------------- KvLease ----|   where to write (data-plane address, block ids)
      |== data plane: blocks + state ==>
      |-- KvWritten ------------->|   decode admits the request, streams tokens
      |<----------------- Ack ----|
    a lease not completed within ``lease_timeout_s`` expires and frees both sides.
"""

from __future__ import annotations

from dsi.messages.base import Message
from dsi.messages.gateway import Generate


class ReserveKv(Message):
    request_id: str
    num_blocks: int
    state_bytes: int
    prompt_tokens: int


class KvLease(Message):
    lease_id: str
    block_ids: list[int]
    state_slot: int
    data_address: str  # data-plane endpoint to write into
    expires_in_s: float


class KvWritten(Message):
    """Sent after the data-plane transfer completed; carries the request to continue."""

    lease_id: str
    request: Generate
    first_token: int
    transfer_id: str = ""


class ReleaseLease(Message):
    lease_id: str
    reason: str = ""


HandoffMsg = ReserveKv | KvLease | KvWritten | ReleaseLease
HANDOFF = (ReserveKv, KvLease, KvWritten, ReleaseLease)
