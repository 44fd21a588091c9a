"""Frozen schema: protocol version 3, to play a peer one version back.

Version 4 added message types (``PrefillStream``, ``FirstToken``) and changed no struct, so a
version-3 peer's structs are the current ones; what it lacks is those types, and it accepts frames
of versions 2 and 3 only. (``protocol_v2`` keeps the structs that changed in version 3.)
"""

from __future__ import annotations

from dsi.messages.version import Protocol

VERSION_3 = Protocol(version=3, oldest=2)
"""A process of version 3 as released: it accepted frames of versions 2 and 3."""
