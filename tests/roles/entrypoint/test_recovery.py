"""Delivered: a re-run is compared with the tokens the client has before anything more is streamed."""

import pytest

from dsi.engine.hit_policy import NO_HIT, HitChoice
from dsi.messages.gateway import TokenChunk
from dsi.roles.entrypoint.recovery import Delivered, RecoveryDiverged


def chunk(ids, finish="", hit=None, logprobs=True) -> TokenChunk:
    return TokenChunk("r", list(ids), finish, 10, 0, [-float(i) for i in ids] if logprobs else [], [], hit)


def run(delivered: Delivered, chunks) -> list[TokenChunk]:
    out = []
    for c in chunks:
        new = delivered.take(c)
        if new is not None:
            out.append(new)
    return out


BOUNDED = HitChoice(256)


def first_run() -> Delivered:
    d = Delivered()
    assert d.pin is None  # nothing delivered: a retry may take any hit
    got = run(d, [chunk([5], hit=BOUNDED), chunk([6, 7]), chunk([8])])
    assert [c.token_ids for c in got] == [[5], [6, 7], [8]]
    return d


def test_the_first_run_streams_everything_and_records_its_hit():
    d = first_run()
    assert d.token_ids == [5, 6, 7, 8]
    assert d.pin == BOUNDED


def test_a_rerun_that_reproduces_the_tokens_streams_only_what_comes_after():
    d = first_run()
    d.rerun()
    got = run(d, [chunk([5], hit=NO_HIT), chunk([6, 7]), chunk([8, 9, 10]), chunk([11], finish="length")])
    assert [c.token_ids for c in got] == [[9, 10], [11]]
    assert got[0].logprobs == [-9.0, -10.0]  # logprobs cut with their ids
    assert d.token_ids == [5, 6, 7, 8, 9, 10, 11]
    assert d.pin == BOUNDED  # the first run's hit, not the re-run's


@pytest.mark.parametrize("rerun", [[[5], [6, 99]], [[5, 6, 7, 99, 100]], [[4]]])
def test_a_rerun_that_differs_anywhere_in_the_delivered_tokens_is_an_error(rerun):
    d = first_run()
    d.rerun()
    with pytest.raises(RecoveryDiverged, match="position"):
        run(d, [chunk(ids) for ids in rerun])
    assert d.token_ids == [5, 6, 7, 8]  # nothing more went out


def test_a_rerun_that_ends_before_it_caught_up_is_an_error():
    d = first_run()
    d.rerun()
    with pytest.raises(RecoveryDiverged, match="ended after 2 tokens"):
        run(d, [chunk([5]), chunk([6], finish="stop")])


def test_a_rerun_ending_exactly_where_the_client_is_ends_the_stream_empty():
    d = first_run()
    d.rerun()
    got = run(d, [chunk([5, 6, 7]), chunk([8], finish="length")])
    assert [(c.token_ids, c.finish) for c in got] == [([], "length")]


def test_an_abort_while_catching_up_passes_through_without_tokens():
    d = first_run()
    d.rerun()
    got = run(d, [chunk([5]), chunk([6], finish="abort")])
    assert [(c.token_ids, c.finish) for c in got] == [([], "abort")]


def test_a_run_that_died_before_any_token_pins_nothing():
    d = Delivered()
    d.rerun()
    got = run(d, [chunk([5], hit=HitChoice(640, exact=True)), chunk([6], finish="stop")])
    assert [c.token_ids for c in got] == [[5], [6]]
    assert d.pin == HitChoice(640, exact=True)
