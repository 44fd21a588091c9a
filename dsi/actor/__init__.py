"""Actor runtime: inbox + single-threaded handler loop + lifecycle; sockets live in dsi.transport."""

from dsi.actor.actor import Actor, handles
from dsi.actor.envelope import Envelope, ReplyChannel
from dsi.actor.local import LocalRef

__all__ = ["Actor", "Envelope", "LocalRef", "ReplyChannel", "handles"]
