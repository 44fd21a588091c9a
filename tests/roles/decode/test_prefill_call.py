"""The decode's call to a prefill: a stream (FirstToken, then Prefilled) to a prefill of protocol
version 4, one PrefillTo ask to a prefill of version 3, PrefillLost when the prefill fails."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dsi.errors import PeerLost
from dsi.messages.gateway import Generate
from dsi.messages.handoff import (
    FirstToken,
    Handoff,
    KvLease,
    Prefilled,
    PrefillLost,
    PrefillStream,
    PrefillTo,
)
from dsi.roles.decode.actor import DecodeActor

REQUEST = Generate("r", [1, 2, 3])
LEASE = KvLease("lease-1", "tcp", "tcp://127.0.0.1:1", 64, 1, 30.0)
FIRST = FirstToken("lease-1", [7], [-0.5])
DONE = Prefilled("lease-1", [7], [-0.5], 1, 0, 3)


class FakePrefill:
    def __init__(self, version: int, fail: bool = False) -> None:
        self.welcome = SimpleNamespace(version=version)
        self.fail = fail
        self.calls: list[tuple[str, object]] = []

    async def ask(self, msg, timeout=None):
        self.calls.append(("ask", msg))
        if self.fail:
            raise PeerLost("gone")
        return DONE

    async def stream(self, msg, timeout=None):
        self.calls.append(("stream", msg))
        yield FIRST
        if self.fail:
            raise PeerLost("gone")
        yield DONE


def _decode(prefill: FakePrefill) -> SimpleNamespace:
    async def peer(address, timeout):
        return prefill

    return SimpleNamespace(peer=peer, counters=SimpleNamespace(failed_handoffs=0))


async def _items(prefill: FakePrefill) -> list:
    decode = _decode(prefill)
    call = PrefillStream(REQUEST, LEASE)
    return [item async for item in DecodeActor._prefill(decode, Handoff(REQUEST, "tcp://p"), call, 5.0)]


async def test_a_version_4_prefill_streams_the_first_token_then_prefilled():
    prefill = FakePrefill(4)
    assert await _items(prefill) == [FIRST, DONE]
    assert [(kind, type(msg)) for kind, msg in prefill.calls] == [("stream", PrefillStream)]


async def test_a_version_3_prefill_is_asked_prefill_to():
    prefill = FakePrefill(3)
    assert await _items(prefill) == [DONE]
    [(kind, msg)] = prefill.calls
    assert kind == "ask" and msg == PrefillTo(REQUEST, LEASE)


@pytest.mark.parametrize("version", [3, 4])
async def test_a_prefill_that_fails_is_prefill_lost(version):
    with pytest.raises(PrefillLost):
        await _items(FakePrefill(version, fail=True))
