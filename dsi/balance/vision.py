"""Vision balancer: an image goes to the serving encoder with the fewest queued pixels (ties:
fewer running requests, then id). Encoder time grows with pixels, not with images, so queued
pixels are the queue's length in work.

Worked example::

    >>> pool = [InstanceLoad(id="e0", role="encoder", queued_pixels=2_000_000),
    ...         InstanceLoad(id="e1", role="encoder", queued_pixels=500_000, running_requests=3),
    ...         InstanceLoad(id="e2", role="encoder", state="draining")]
    >>> route_vision(1_048_576, pool)
    VisionDecision(instance='e1', queued_pixels=500000)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dsi.balance.load import InstanceLoad, NoInstance, serving


@dataclass(slots=True, frozen=True)
class VisionDecision:
    instance: str
    queued_pixels: int  # pixels queued on it ahead of this image


def route_vision(pixels: int, instances: Sequence[InstanceLoad]) -> VisionDecision:
    """The encoder for an image (or a request's images) of ``pixels`` (>= 1) pixels in all."""
    if pixels < 1:
        raise ValueError(f"an image has >= 1 pixel, not {pixels}")
    pool = serving(instances, "encoder")
    if not pool:
        raise NoInstance("no serving encoder instance")
    best = min(pool, key=lambda i: (i.queued_pixels, i.running_requests, i.id))
    return VisionDecision(best.id, best.queued_pixels)
