"""Transfer ids: a readable name and 128 random bits.

A transfer id is all a sender shows to write into a receive region (the lease a receiver
handed out over the control plane), so it must not be guessable from what other peers can see:
role names and request ids are readable, the random part is not::

    decode-0.chatcmpl-5f1e....9c.3b6f0a1d2c4e5f60718293a4b5c6d7e8
    `--------- name(s) ---------' `---- 128 random bits, hex ----'
"""

from __future__ import annotations

import secrets

TRANSFER_ID_RANDOM_BITS = 128


def transfer_id(*names: str) -> str:
    """``names`` joined by dots, then 128 random bits as 32 hex digits."""
    return ".".join((*names, secrets.token_hex(TRANSFER_ID_RANDOM_BITS // 8)))
