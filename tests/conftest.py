"""Fixtures shared across the test tree."""

import pytest

from tests.dsi.cli.procs import Procs


@pytest.fixture
def procs(tmp_path):
    """Processes a test starts; every one is stopped at teardown (by PID)."""
    with Procs(tmp_path) as group:
        yield group
