"""The protocol version rule (dsi.messages.version) and the schema rule that makes it hold: every
message of the frozen version-2 schema decodes as the current one and back."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dsi.engine.params import SamplingParams
from dsi.errors import VersionMismatch
from dsi.messages import ALL, COMMON
from dsi.messages.version import CURRENT, OLDEST_ACCEPTED, PROTOCOL_VERSION, Protocol
from dsi.structured.spec import StructuredSpec
from tests.transport import protocol_v2 as v2

CURRENT_BY_NAME = {tp.__name__: tp for tp in (*ALL, *COMMON)}


def test_a_process_accepts_the_version_before_its_own_and_its_own_only():
    assert OLDEST_ACCEPTED == PROTOCOL_VERSION - 1
    assert [v for v in range(256) if CURRENT.accepts(v)] == [PROTOCOL_VERSION - 1, PROTOCOL_VERSION]
    CURRENT.check(PROTOCOL_VERSION - 1)
    with pytest.raises(VersionMismatch, match=f"version {PROTOCOL_VERSION - 2}"):
        CURRENT.check(PROTOCOL_VERSION - 2)
    with pytest.raises(VersionMismatch):
        CURRENT.check(PROTOCOL_VERSION + 1)


def test_a_connection_speaks_the_lower_version_and_refuses_two_steps():
    assert CURRENT.spoken_with(PROTOCOL_VERSION + 1) == PROTOCOL_VERSION  # the newer peer comes down
    assert CURRENT.spoken_with(PROTOCOL_VERSION - 1) == PROTOCOL_VERSION - 1
    with pytest.raises(VersionMismatch, match="one version at a time"):
        CURRENT.spoken_with(PROTOCOL_VERSION - 2)
    # Both ends of a pair one version apart agree on the same version.
    old, new = Protocol(4, 3), Protocol(5, 4)
    assert old.spoken_with(new.version) == new.spoken_with(old.version) == 4
    with pytest.raises(ValueError):
        Protocol(version=2, oldest=3)


@pytest.mark.parametrize("old", v2.FROZEN, ids=lambda tp: tp.__name__)
def test_each_frozen_struct_is_a_prefix_of_the_current_one_and_what_was_added_has_a_default(old):
    new = CURRENT_BY_NAME[old.__name__]
    old_fields = msgspec.structs.fields(old)
    new_fields = msgspec.structs.fields(new)
    assert [f.name for f in new_fields[: len(old_fields)]] == [f.name for f in old_fields]
    added = new_fields[len(old_fields) :]
    assert all(f.required is False for f in added), [f.name for f in added if f.required]


def test_what_a_version_2_peer_sends_decodes_here_with_defaults_and_back():
    sampling = SamplingParams(max_tokens=3)
    old = v2.TokenChunk("r", [5, 6], "stop", 2, 1)
    new = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=CURRENT_BY_NAME["TokenChunk"])
    assert (new.request_id, new.token_ids, new.finish, new.prompt_tokens, new.cached_tokens) == (
        "r",
        [5, 6],
        "stop",
        2,
        1,
    )
    assert new.seq == 0  # not numbered: the field came with version 3
    newer = msgspec.structs.replace(new, seq=7)
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(newer), type=v2.TokenChunk | v2.Abort)
    assert back == old  # the trailing seq is ignored by version 2
    generate = CURRENT_BY_NAME["Generate"]("r", [1, 2], sampling, delivered=[9])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(generate), type=v2.Generate).delivered == [9]


def _structs(tp: Any, seen: set[type]) -> None:
    """Every msgspec struct type reachable from the type info ``tp``."""
    if isinstance(tp, msgspec.inspect.StructType):
        if tp.cls in seen:
            return
        seen.add(tp.cls)
        for field in tp.fields:
            _structs(field.type, seen)
        return
    for attr in ("item_type", "key_type", "value_type"):
        if hasattr(tp, attr):
            _structs(getattr(tp, attr), seen)
    for attr in ("types", "item_types"):
        for inner in getattr(tp, attr, ()):
            _structs(inner, seen)


def test_no_struct_on_the_control_plane_refuses_unknown_fields():
    seen: set[type] = set()
    for info in msgspec.inspect.multi_type_info([*ALL, *COMMON]):
        _structs(info, seen)
    assert StructuredSpec in seen  # the walk reaches nested structs (SamplingParams.structured)
    refusing = sorted(cls.__name__ for cls in seen if cls.__struct_config__.forbid_unknown_fields)
    assert refusing == []
