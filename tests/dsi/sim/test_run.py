"""simulate(): one call from requests to a summary, refusing what cannot run."""

from __future__ import annotations

import pytest

from dsi.sim import SimConfig, get_profile, simulate


def test_an_empty_workload_is_refused():
    with pytest.raises(ValueError, match="at least one request"):
        simulate([], SimConfig(), get_profile("h800"))
