"""Typed control-plane messages, one module per channel family.

``ALL`` is every message class; a caller that can receive anything decodes with it.
"""

from dsi.messages.balancer import BALANCER
from dsi.messages.base import COMMON, PROTOCOL_VERSION, Message
from dsi.messages.blob import Blob
from dsi.messages.control import CONTROL
from dsi.messages.gateway import GATEWAY
from dsi.messages.handoff import HANDOFF
from dsi.messages.kvstore import KVSTORE
from dsi.messages.migrate import MIGRATE
from dsi.messages.vision import VISION

ALL = (*CONTROL, *GATEWAY, *HANDOFF, *KVSTORE, *BALANCER, *MIGRATE, *VISION)

__all__ = [
    "ALL",
    "BALANCER",
    "COMMON",
    "CONTROL",
    "GATEWAY",
    "HANDOFF",
    "KVSTORE",
    "MIGRATE",
    "PROTOCOL_VERSION",
    "VISION",
    "Blob",
    "Message",
]
