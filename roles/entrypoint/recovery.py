"""A re-run of a request whose decode died, checked against what the client already has.

The gateway streams tokens as they come. When the decode serving a request dies, the request
is re-run elsewhere from its prompt, with the same seed and pinned to the prefix hit the first
run took (``Generate.pin_hit``; see ``dsi.engine.hit_policy.pinned_hit``). Sampling is keyed by
(seed, position) and the engine is batch-invariant, so the re-run should produce the same
tokens; ``Delivered`` checks that it does, position by position, before anything more goes
out::

    delivered    t0 t1 t2 t3 |  (the decode dies)
    re-run       t0 t1 t2 t3    t4 t5 ...       t4 t5 ... are streamed
    re-run       t0 t1 x2 ...                   RecoveryDiverged: the stream ends with an error

A difference, or a re-run that ends before it caught up, ends the request with
``RecoveryDiverged`` (the gateway writes the protocol's error event): never a splice of two
continuations.
"""

from __future__ import annotations

import msgspec

from dsi.engine.hit_policy import HitChoice
from dsi.errors import DsiError
from dsi.messages.gateway import TokenChunk


class RecoveryDiverged(DsiError):
    """A re-run did not reproduce the tokens the client already has."""

    code = "recovery_diverged"


class Delivered:
    """The tokens of one request the caller has, and the hit the run that made them took.

    ``rerun()`` before each attempt after the first; ``take(chunk)`` for every chunk of an
    attempt returns what is new to the caller (None: nothing yet) or raises RecoveryDiverged.
    """

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.hit: HitChoice | None = None  # None: unknown, or nothing delivered yet
        self._checked = 0  # of token_ids, reproduced by the current attempt

    def rerun(self) -> None:
        self._checked = 0

    @property
    def pin(self) -> HitChoice | None:
        """The hit a re-run must take (None: any, when the caller has nothing yet)."""
        return self.hit if self.token_ids else None

    def take(self, chunk: TokenChunk) -> TokenChunk | None:
        if not self.token_ids and chunk.hit is not None:
            self.hit = chunk.hit
        delivered = self.token_ids
        if self._checked == len(delivered):  # nothing to catch up (every chunk of a first run)
            delivered += chunk.token_ids
            self._checked = len(delivered)
            return chunk
        ids, n = chunk.token_ids, min(len(chunk.token_ids), len(self.token_ids) - self._checked)
        if n > 0:
            self._compare(ids[:n])
        if self._checked < len(self.token_ids):  # still catching up
            if chunk.finish in ("stop", "length"):
                raise RecoveryDiverged(
                    f"the re-run ended after {self._checked} tokens; the client already has "
                    f"{len(self.token_ids)}"
                )
            return (
                msgspec.structs.replace(chunk, token_ids=[], logprobs=[], top_logprobs=[])
                if chunk.finish
                else None
            )
        if n > 0:
            if n == len(ids) and not chunk.finish:
                return None
            chunk = msgspec.structs.replace(
                chunk, token_ids=ids[n:], logprobs=chunk.logprobs[n:], top_logprobs=chunk.top_logprobs[n:]
            )
        self.token_ids += chunk.token_ids
        self._checked = len(self.token_ids)
        return chunk

    def _compare(self, ids: list[int]) -> None:
        start = self._checked
        for i, (got, had) in enumerate(zip(ids, self.token_ids[start : start + len(ids)], strict=True)):
            if got != had:
                raise RecoveryDiverged(
                    f"the re-run produced token {got} at position {start + i} where the client "
                    f"already has {had}"
                )
        self._checked += len(ids)
