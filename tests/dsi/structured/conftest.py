import os

import pytest

from dsi.model.config import TINY
from dsi.model.weights import init_weights

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny():
    return TINY, init_weights(TINY)
