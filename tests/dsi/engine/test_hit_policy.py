"""The hit policy as a pure function: which hit a prefill takes from what the store and the SWA
state owners hold (block 128, window 128, keep 140: the tiny and flash shapes)."""

import msgspec
import pytest

from dsi.engine.hit_policy import (
    HIT_POLICIES,
    NO_HIT,
    HitChoice,
    choose_hit,
    exact_boundary,
    fetch_limit,
    pinned_hit,
    predicted_hit,
)
from dsi.model.hits import consumer_start, exact_hit_limit, max_hit, replay_start

BS, WINDOW, KEEP = 128, 128, 140


def choose(policy: str, stored: int, prompt_len: int, state_held: bool, keep: int | None = KEEP) -> HitChoice:
    return choose_hit(policy, stored, prompt_len, keep, BS, state_held)  # type: ignore[arg-type]


def test_the_policies_are_bounded_and_exact():
    assert HIT_POLICIES == ("bounded", "exact")


def test_a_held_state_gives_the_exact_hit_under_both_policies():
    # 900 tokens: consumer_start 760, so an exact hit ends at 640 at most; the store holds 768
    for policy in HIT_POLICIES:
        assert choose(policy, 768, 900, state_held=True) == HitChoice(640, exact=True)
        assert choose(policy, 512, 900, state_held=True) == HitChoice(512, exact=True)


def test_without_the_state_bounded_replays_every_stored_page_and_exact_takes_none():
    assert choose("bounded", 768, 900, state_held=False) == HitChoice(768, exact=False)
    assert replay_start(768, consumer_start(900, KEEP), WINDOW) == 640  # 128 positions replayed
    assert choose("exact", 768, 900, state_held=False) == NO_HIT
    for policy in HIT_POLICIES:
        assert choose(policy, 0, 900, state_held=False) == NO_HIT


def test_no_exact_hit_is_possible_in_a_short_prompt():
    # 260 tokens: consumer_start 120 < 128, so no boundary can be exact; a state cannot help
    assert exact_boundary(256, 260, KEEP, BS) == 0
    assert choose("exact", 256, 260, state_held=True) == NO_HIT
    assert choose("bounded", 256, 260, state_held=True) == HitChoice(256)
    # nor without decoder-side replay (keep None: consumer layers see every position)
    assert choose("exact", 640, 900, state_held=True, keep=None) == NO_HIT
    assert choose("bounded", 640, 900, state_held=True, keep=None) == HitChoice(640)


@pytest.mark.parametrize("prompt_len", [129, 141, 200, 268, 269, 300, 640, 641, 900, 5000])
def test_exact_refuses_a_bounded_hit_even_when_its_replay_starts_at_zero(prompt_len):
    """A bounded hit with R = 0 has the hit-free output (up to rounding), but the engine computes
    ``len - R`` prompt positions (tests/dsi/engine/test_prefix_hit.py counts them): all of them,
    the work of a miss. ``exact`` takes none instead, which also keeps the request shareable."""
    start = consumer_start(prompt_len, KEEP)
    zero_r = [h for h in range(BS, max_hit(prompt_len, BS) + 1, BS) if replay_start(h, start, WINDOW) == 0]
    assert zero_r  # H = 128 always has R = 0 (window 128)
    for hit in zero_r:
        assert choose("exact", hit, prompt_len, state_held=False) == NO_HIT


def test_exact_is_never_a_replay_and_never_longer_than_the_store_or_the_limit():
    for prompt_len in range(1, 1200, 37):
        limit = exact_hit_limit(prompt_len, KEEP, BS)
        for stored in range(0, max_hit(prompt_len, BS) + 1, BS):
            for held in (False, True):
                hit = choose("exact", stored, prompt_len, held)
                assert hit == NO_HIT or (hit.exact and 0 < hit.tokens <= min(stored, limit))
                assert hit.tokens % BS == 0
                bounded = choose("bounded", stored, prompt_len, held)
                assert bounded.tokens <= stored and (bounded.exact or bounded.tokens in (0, stored))


def test_fetch_limit_and_the_gateways_prediction():
    assert fetch_limit("bounded", 900, KEEP, BS) == 896  # every full block but the last token's
    assert fetch_limit("exact", 900, KEEP, BS) == 640  # no page past an exact boundary is used
    assert fetch_limit("exact", 260, KEEP, BS) == 0
    assert predicted_hit("bounded", 768, 900, KEEP, BS) == 768
    assert predicted_hit("exact", 768, 900, KEEP, BS) == 640
    assert predicted_hit("exact", 256, 900, KEEP, BS) == 256
    assert predicted_hit("exact", 256, 260, KEEP, BS) == 0


def test_a_pinned_rerun_takes_the_first_runs_hit_or_one_with_the_same_output():
    # none: none, whatever the store holds now
    assert pinned_hit(NO_HIT, 0, state_held=False) == NO_HIT
    # exact H: again when pages and state are there; else none (both have the hit-free output)
    exact = HitChoice(640, exact=True)
    assert pinned_hit(exact, 640, state_held=True) == exact
    assert pinned_hit(exact, 640, state_held=False) == NO_HIT
    assert pinned_hit(exact, 512, state_held=False) == NO_HIT
    # bounded H: only the same H (its replay window follows from H), or nothing
    bounded = HitChoice(768)
    assert pinned_hit(bounded, 768, state_held=False) == bounded
    assert pinned_hit(bounded, 768, state_held=True) == bounded  # a held state does not make it exact
    assert pinned_hit(bounded, 640, state_held=False) is None


def test_a_hit_choice_travels_as_msgpack():
    for hit in (NO_HIT, HitChoice(640, exact=True), HitChoice(768)):
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(hit), type=HitChoice) == hit


def test_without_rings_every_stored_page_is_an_exact_hit_under_both_policies():
    """A full-attention family (Llama) keeps its whole cache in the pages: nothing to pull."""
    for policy in HIT_POLICIES:
        assert fetch_limit(policy, 900, None, BS, rings=False) == 896  # type: ignore[arg-type]
        assert predicted_hit(policy, 768, 900, None, BS, rings=False) == 768  # type: ignore[arg-type]
        got = choose_hit(policy, 768, 900, None, BS, state_held=False, rings=False)  # type: ignore[arg-type]
        assert got == HitChoice(768, exact=True)
        assert choose_hit(policy, 0, 900, None, BS, False, rings=False) == NO_HIT  # type: ignore[arg-type]
    assert pinned_hit(HitChoice(768, exact=True), 768, state_held=True) == HitChoice(768, exact=True)
