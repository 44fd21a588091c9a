"""reference_logits(hit=H): the semantics of a prefix hit with encoder-side bounded replay."""

import random

import pytest
import torch

from dsi.model.config import TINY
from dsi.model.reference import consumer_start, max_hit, reference_logits, replay_start
from dsi.model.weights import init_weights


@pytest.fixture(scope="module")
def w():
    return init_weights(TINY)


def _prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(100, 120_000) for _ in range(n)]


def test_replay_start_and_max_hit():
    assert max_hit(128, 128) == 0 and max_hit(129, 128) == 128 and max_hit(256, 128) == 128
    assert replay_start(0, 500, 128) == 0
    assert replay_start(128, 60, 128) == 0  # a one-block hit replays from 0
    assert replay_start(640, 560, 128) == 512  # the last window before the hit
    assert replay_start(256, 121, 128) == 121  # consumer rows need producer states from consumer_start


@pytest.mark.parametrize("hit", [-128, 64, 256])
def test_bad_hit_is_a_value_error(w, hit):
    with pytest.raises(ValueError, match="hit"):
        reference_logits(TINY, w, _prompt(256, 1), 256, TINY.keep, last_only=True, hit=hit)


def test_hit_with_replay_from_zero_only_rounds(w):
    prompt = _prompt(200, 2)
    cold = reference_logits(TINY, w, prompt, 200, TINY.keep, last_only=True)
    hit = reference_logits(TINY, w, prompt, 200, TINY.keep, last_only=True, hit=128)
    assert torch.allclose(cold, hit, atol=1e-4, rtol=0)


def test_hit_differs_from_cold_and_depends_on_the_cached_prefix_only_through_its_tokens(w):
    prompt = _prompt(700, 3)
    assert consumer_start(700, TINY.keep) == 560
    cold = reference_logits(TINY, w, prompt, 700, TINY.keep, last_only=True)
    hit = reference_logits(TINY, w, prompt, 700, TINY.keep, last_only=True, hit=640)
    assert (cold - hit).abs().max() > 1e-3
    # Tokens before R reach the output only through the cached latents (and never through SWA).
    changed = list(prompt)
    changed[100] += 1
    assert not torch.equal(hit, reference_logits(TINY, w, changed, 700, TINY.keep, last_only=True, hit=640))
