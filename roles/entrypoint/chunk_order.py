"""ChunkOrder: the chunks of one stream are taken in order, each once, or the stream is given up.

A decode numbers the chunks of each stream it sends (``TokenChunk.seq``: 1, 2, ...). A chunk lost
on the way (a socket that dropped it, a fault) shows as a gap in the numbers; a chunk delivered
twice shows as a number already seen::

    seq   1 2 3 5        ChunkGap at 5: chunk 4's tokens never arrived
    seq   1 2 2 3        the second 2 is dropped
    seq   1 2 3 (END)    ChunkGap: the stream ended before its last chunk (the one with ``finish``)
    seq   0 0 0          not numbered (a sender that predates numbering): taken as they come

The gateway treats a gap as a lost decode: it re-runs the request and checks the re-run against
the tokens the client already has before it streams anything more (dsi.roles.entrypoint.recovery),
so the client never sees a stream with a hole in it.
"""

from __future__ import annotations

from dsi.errors import DsiError
from dsi.messages.gateway import TokenChunk


class ChunkGap(DsiError):
    """Chunks of a stream were lost on the way: what the client would get has a hole."""

    code = "chunk_gap"


class ChunkOrder:
    """The numbers seen on one stream (one attempt of one request)."""

    __slots__ = ("duplicates", "expected", "finished", "numbered")

    def __init__(self) -> None:
        self.expected = 1  # the next chunk's number
        self.numbered = False  # a numbered chunk arrived
        self.finished = False  # the chunk with ``finish`` arrived
        self.duplicates = 0

    def take(self, chunk: TokenChunk) -> bool:
        """True: the next chunk, to use; False: a duplicate, to drop. ChunkGap when chunks before
        this one were lost."""
        seq = chunk.seq
        if seq == self.expected:
            self.expected += 1
            self.numbered = True
        elif seq == 0:  # not numbered
            pass
        elif seq < self.expected:
            self.duplicates += 1
            return False
        else:
            raise ChunkGap(
                f"request {chunk.request_id}: chunk {seq} arrived where {self.expected} was due; "
                f"{seq - self.expected} lost on the way"
            )
        self.finished = self.finished or bool(chunk.finish)
        return True

    def ended(self, request_id: str) -> None:
        """The stream ended (its END arrived): ChunkGap if a numbered stream's last chunk did not."""
        if self.numbered and not self.finished:
            raise ChunkGap(
                f"request {request_id}: the stream ended after chunk {self.expected - 1} without its last one"
            )
