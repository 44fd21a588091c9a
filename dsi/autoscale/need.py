"""How many serving instances a demand needs: capacity strictly above demand plus a margin."""

from __future__ import annotations

import math


def required_capacity(demand: float, margin: float) -> float:
    """demand * (1 + margin), in the role's unit (tokens/s or active requests)."""
    return demand * (1.0 + margin)


def instances_needed(demand: float, capacity: float, margin: float) -> int:
    """The smallest n with n * capacity > demand * (1 + margin); 0 when demand is 0.

    ceil(demand * (1 + margin) / capacity) would stop at equality on an exact multiple (demand
    200, capacity 100, margin 0 -> 2, no headroom left); this gives 3. The comparison is done in
    the same float products a caller would check, so the result never falls one short by
    rounding. With no demand nothing is needed, and ``min_instances`` decides what stays up.
    """
    if demand == 0:
        return 0
    required = required_capacity(demand, margin)
    count = math.floor(required / capacity) + 1
    while count > 1 and (count - 1) * capacity > required:
        count -= 1
    while count * capacity <= required:
        count += 1
    return count
