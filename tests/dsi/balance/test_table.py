"""Routing from a decision table with a router's in-flight additions: exact picks."""

import pytest

from dsi.balance import InstanceLoad, NoInstance
from dsi.balance.decode import DecodeBands
from dsi.balance.table import DecisionTable, InFlight, decode_from_table, prefill_from_table

EDGES = (16_384, 65_536, 262_144)


def _prefill(i: str, queued: int = 0, state: str = "serving") -> InstanceLoad:
    return InstanceLoad(id=i, role="prefill", queued_tokens=queued, state=state)  # type: ignore[arg-type]


def _decode(
    i: str, running: int = 0, kv: int = 0, max_requests: int = 8, state: str = "serving", queued: int = 0
) -> InstanceLoad:
    return InstanceLoad(
        id=i,
        role="decode",
        state=state,  # type: ignore[arg-type]
        queued_tokens=queued,
        running_requests=running,
        kv_tokens=kv,
        max_requests=max_requests,
        kv_capacity_tokens=100_000,
    )


def _table(**kw) -> DecisionTable:
    base = dict(
        edges=EDGES,
        buckets=(("p0", "p1"), ("p2",), ("p2",), ("p3",)),
        prefills=(_prefill("p0", 1_000), _prefill("p1", 3_000), _prefill("p2"), _prefill("p3")),
        decodes=(),
    )
    return DecisionTable(**(base | kw))


def test_prefill_picks_follow_buckets_and_in_flight_additions():
    table, inflight = _table(), InFlight()
    picks = []
    for uncached in (2_000, 2_000, 500, 20_000, 300_000, 16_384, 16_383):
        instance, bucket = prefill_from_table(table, uncached, inflight)
        inflight.add(instance, uncached)
        picks.append((instance, bucket))
    # p0 1,000 queued < p1 3,000; then p0 3,000 = p1 3,000, p0 has one running: p1; then p0 3,000 < 5,000
    assert picks == [("p0", 0), ("p1", 0), ("p0", 0), ("p2", 1), ("p3", 3), ("p2", 1), ("p0", 0)]
    assert inflight.tokens == {"p0": 18_883, "p1": 2_000, "p2": 36_384, "p3": 300_000}


def test_prefill_excluded_engine_goes_to_the_least_queued_other():
    table, inflight = _table(), InFlight()
    inflight.add("p3", 300_000)
    assert prefill_from_table(table, 20_000, inflight, exclude={"p2"}) == (
        "p0",
        1,
    )  # p2's bucket has no other
    assert prefill_from_table(table, 2_000, inflight, exclude={"p0"}) == ("p1", 0)
    with pytest.raises(NoInstance):
        prefill_from_table(table, 2_000, inflight, exclude={"p0", "p1", "p2", "p3"})


def test_decode_picks_with_in_flight_additions_full_draining_and_bands():
    decodes = (
        _decode("d0", running=4, max_requests=4),
        _decode("d1"),
        _decode("d2"),
        _decode("d3", state="draining"),
    )
    table, inflight = _table(decodes=decodes), InFlight()
    picks = []
    for kv in (1_000, 1_000, 1_000):
        d = decode_from_table(table, kv, inflight)
        inflight.add(d.instance, kv)
        picks.append(d.instance)
    # d0 is full, d3 draining; d1 and d2 tie at 1/8 (d1 by id), then d2 1/8 < d1 2/8, then tie again
    assert picks == ["d1", "d2", "d1"]

    banded = _table(decodes=decodes, bands=DecodeBands(8_192, ("d2",), 0.5))
    long = decode_from_table(banded, 20_000, inflight)
    assert (long.instance, long.band, long.spilled, long.score) == ("d2", "long", False, 0.25)
    short = decode_from_table(banded, 1_000, inflight)
    assert (short.instance, short.band, short.score) == ("d1", "short", 0.375)
    assert (
        decode_from_table(banded, 1_000, inflight, exclude={"d1"}).instance == "d2"
    )  # spills out of its band


def test_colocated_decode_picks_follow_the_queued_prompt_tokens_and_in_flight_additions():
    """Decodes that compute their requests' prompts: a burst spreads by the prompt tokens queued
    (reported plus this router's additions), not by score."""
    table, inflight = (
        _table(decodes=(_decode("d0", running=1, queued=1_500), _decode("d1", running=5))),
        InFlight(),
    )
    picks = []
    for kv in (2_000, 1_000, 600):
        d = decode_from_table(table, kv, inflight, colocated=True)
        inflight.add(d.instance, kv)
        picks.append(d.instance)
    assert picks == ["d1", "d0", "d1"]  # queued d1 / d0: 0 / 1,500; 2,000 / 1,500; 2,000 / 2,500
    assert decode_from_table(table, 1_000, InFlight()).instance == "d0"  # handed over: by score


def test_in_flight_removal_restores_the_table_loads():
    inflight = InFlight()
    inflight.add("d1", 1_000)
    inflight.add("d1", 500)
    inflight.remove("d1", 1_000)
    assert (inflight.requests, inflight.tokens) == ({"d1": 1}, {"d1": 500})
    inflight.remove("d1", 500)
    load = _decode("d1", running=2, kv=10)
    assert (inflight.requests, inflight.applied(load)) == ({}, load)
