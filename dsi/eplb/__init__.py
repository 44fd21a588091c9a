"""Expert-parallel load balancing (EPLB): placement policy, routing among replicas, EP sizing.

Pure code (no I/O): :func:`rebalance` turns per-expert loads into a :class:`Placement`,
:func:`pick_slots` routes token-expert pairs among replicas by load, :func:`resize` sizes the
group for the healthy ranks, :func:`split_rows` spreads a step's sequences over the ranks for
data-parallel attention. The expert-parallel runtime is :mod:`dsi.eplb.group`.
"""

from dsi.eplb.placement import Placement, imbalance
from dsi.eplb.policy import Policy, policy_for, rebalance
from dsi.eplb.resize import EpSize, initial_placement, resize, slots_per_rank
from dsi.eplb.routing import pick_slots, water_fill
from dsi.eplb.rows import split_rows
from dsi.eplb.window import LoadWindow

__all__ = [
    "EpSize",
    "LoadWindow",
    "Placement",
    "Policy",
    "imbalance",
    "initial_placement",
    "pick_slots",
    "policy_for",
    "rebalance",
    "resize",
    "slots_per_rank",
    "split_rows",
    "water_fill",
]
