"""One simulation from a workload, a config and a profile to its JSON summary."""

from __future__ import annotations

from collections.abc import Sequence

from dsi.sim.cluster import Cluster
from dsi.sim.config import SimConfig
from dsi.sim.profiles import HardwareProfile
from dsi.sim.summary import summarize
from dsi.sim.workload import SimRequest


def simulate(requests: Sequence[SimRequest], cfg: SimConfig, profile: HardwareProfile) -> dict:
    """The summary of ``requests`` (sorted by arrival) through a cluster of ``cfg`` on ``profile``."""
    if not requests:
        raise ValueError("a simulation needs at least one request")
    too_long = [r.id for r in requests if r.prompt_tokens + r.output_tokens > profile.decode_kv_tokens]
    if too_long:
        raise ValueError(
            f"{len(too_long)} requests (first: {too_long[0]}) do not fit one decode instance of "
            f"{profile.decode_kv_tokens} KV tokens"
        )
    return summarize(Cluster(cfg, profile, requests).run())
