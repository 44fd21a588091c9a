import random

import pytest
import torch

from dsi.model.config import TINY
from dsi.model.weights import init_weights


@pytest.fixture(scope="session")
def tiny():
    return TINY, init_weights(TINY)


def random_prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(100, 120_000) for _ in range(n)] for n in lengths]


# Row counts of the batch-invariance tests: 1 .. 2,048 (a full prefill block), sampled.
ROW_COUNTS = [*range(1, 20), 31, 32, 33, 64, 100, 127, 129, 257, 511, 1000, 1024, 1500, 2047, 2048]


@pytest.fixture
def threads():
    """Sets torch's intra-op thread count for the test; restores it afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def rows_with(x: torch.Tensor, m: int, seed: int) -> tuple[torch.Tensor, int]:
    """m random rows [m, K] with x at a random position; returns (rows, position)."""
    rng = random.Random(seed)
    rows = torch.randn(m, x.shape[0], generator=torch.Generator().manual_seed(seed))
    at = rng.randrange(m)
    rows[at] = x
    return rows, at
