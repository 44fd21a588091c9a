"""The control plane's protocol version, and which peer versions a process works with.

Every frame header carries a protocol version (dsi.transport.wire). A process of version N
accepts frames of versions ``OLDEST_ACCEPTED`` (N-1) to N, so a cluster upgrades one version at a
time with its roles running: during the upgrade some processes speak N-1 and some N.

    a Peer (client) of version C            an ActorServer of version S
      Hello  (header: C's oldest; body: C) --> accepts a Hello of any header version;
                                                spoken = min(C, S); refused when spoken < S's oldest
      <-- Welcome(spoken) or ERROR(version_mismatch), the header in the Hello's version
      calls stamped `spoken` ---------------->  accepted when S's oldest <= version <= S
      <-- replies stamped with the call's version (the caller accepts its own version)

A connection speaks the lower of its two versions, and the client holds its calls until the
handshake has settled which. A frame of a version the receiver does not accept is answered with
an ERROR frame (``version_mismatch``) stamped with the frame's own version, so that even a
sender too old to be served reads a typed error instead of waiting for a timeout. Publishers
(dsi.transport.pubsub) stamp their own version; a subscriber accepts the same window.

Schema rule for a new version N (what makes an N-1 peer's messages decode at N and back):

- messages are msgpack arrays (``array_like``): add a field only at the end of a struct, with a
  default, so that a message of N-1, which lacks it, decodes at N with the default; an N-1 peer
  ignores the trailing fields it does not know. Never remove, reorder or retype a field;
- no struct on the wire refuses unknown fields (``forbid_unknown_fields``);
- a message type, frame kind or meaning added in N goes only to a peer whose connection speaks
  N (``Peer.welcome.version``): an N-1 peer answers one it cannot decode with ``bad_message``.

The KV data plane (dsi.transport.kv.wire) has no version header: a transfer starts only after a
control-plane call between the same two processes has passed this check, and its messages follow
the same schema rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsi.errors import VersionMismatch

PROTOCOL_VERSION = 4
"""This process's version. 2: BATCH frames. 3: the N-1 window, negotiated versions, numbered
TokenChunks (``seq``) and the version in heartbeats (``Heartbeat.protocol``). 4: ``PrefillStream``
and ``FirstToken`` (a prefill streams the first token ahead of the KV handoff; a decode asks a
prefill that speaks 3 with ``PrefillTo``)."""

OLDEST_ACCEPTED = PROTOCOL_VERSION - 1


@dataclass(frozen=True, slots=True)
class Protocol:
    """The versions one process speaks: ``version`` and every one from ``oldest`` up to it."""

    version: int = PROTOCOL_VERSION
    oldest: int = OLDEST_ACCEPTED

    def __post_init__(self) -> None:
        if not 0 < self.oldest <= self.version < 256:
            raise ValueError(f"protocol versions must satisfy 0 < oldest <= version < 256, got {self}")

    def accepts(self, version: int) -> bool:
        return self.oldest <= version <= self.version

    def check(self, version: int) -> None:
        """Raise VersionMismatch unless a frame of ``version`` is accepted."""
        if not self.accepts(version):
            raise VersionMismatch(
                f"peer speaks protocol version {version}, this process speaks {self.oldest} to {self.version}"
            )

    def spoken_with(self, peer_version: int) -> int:
        """The version a connection to a peer of ``peer_version`` speaks: the lower of the two;
        VersionMismatch when that is older than this process accepts."""
        spoken = min(peer_version, self.version)
        if spoken < self.oldest:
            raise VersionMismatch(
                f"peer speaks protocol version {peer_version}; this process needs {self.oldest} "
                f"to {self.version} (upgrade one version at a time, see docs/operations/upgrades.md)"
            )
        return spoken


CURRENT = Protocol()
