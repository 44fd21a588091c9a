"""Transfer ids carry 128 random bits, travel every backend unchanged, and an id that differs
only in its random part (a peer that knows the role name and the request id) is refused."""

from __future__ import annotations

import re

import msgspec
import pytest

from dsi.transport.kv import TransferFailed
from dsi.transport.kv.ids import TRANSFER_ID_RANDOM_BITS, transfer_id
from tests.transport.kv.planes import BACKENDS, plane_pair

SIZE = 1 << 16


def test_a_transfer_id_is_its_names_and_128_random_bits():
    ids = {transfer_id("decode-0", "chatcmpl-abc") for _ in range(1000)}
    assert len(ids) == 1000
    for tid in ids:
        m = re.fullmatch(r"decode-0\.chatcmpl-abc\.([0-9a-f]+)", tid)
        assert m is not None and len(m.group(1)) * 4 == TRANSFER_ID_RANDOM_BITS == 128


@pytest.mark.parametrize("backend", BACKENDS)
async def test_only_the_exact_id_writes_into_the_region(backend):
    async with plane_pair(backend) as (receiver, sender):
        tid = transfer_id("decode-0", "chatcmpl-abc")
        inbound = receiver.expect(tid, SIZE, 10.0)
        assert inbound.target.transfer_id == tid
        guessed = msgspec.structs.replace(inbound.target, transfer_id=transfer_id("decode-0", "chatcmpl-abc"))
        with pytest.raises(TransferFailed):
            await sender.send(guessed, [b"\x01" * SIZE], 5.0)
        await sender.send(inbound.target, [b"\x02" * SIZE], 5.0)
        assert bytes(await inbound.wait()) == b"\x02" * SIZE
        inbound.release()
