import random

import pytest

from dsi.model.config import TINY
from dsi.model.weights import init_weights


@pytest.fixture(scope="session")
def tiny():
    return TINY, init_weights(TINY)


def random_prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 120_000) for _ in range(n)] for n in lengths]
