"""The CPU engine: continuous batching over paged Block KV, prefix hits, disaggregated handoff.

    engine = Engine(cfg, weights, EngineConfig())
    engine.add_request("r", prompt, SamplingParams(), cached=CachedPrefix(H, pages))
    engine.step() / run_until_done()
    engine.add_request("r", prompt, SamplingParams(), cached=CachedPrefix(H, pages, rings))  # exact hit
    engine.export_request / reserve / import_request / take_full_pages / take_ring_snapshots

``EngineService`` drives an engine from asyncio. Names are imported lazily, so that
``dsi.engine.params`` stays importable without loading torch.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "CachedPrefix": "prefix",
    "Engine": "engine",
    "EngineConfig": "engine",
    "EngineService": "service",
    "EngineStats": "prefix",
    "FullPage": "prefix",
    "RequestOutput": "engine",
    "RequestState": "transfer",
    "RequestStats": "prefix",
    "RingSnapshot": "prefix",
    "Reservation": "transfer",
    "SamplingParams": "params",
    "StateLayout": "transfer",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dsi.engine' has no attribute {name!r}")
    return getattr(import_module(f"dsi.engine.{home}"), name)
