"""The CPU engine: continuous batching over paged Block KV, prefix hits, disaggregated handoff.

    engine = Engine(cfg, weights, EngineConfig())
    engine.add_request("r", prompt, SamplingParams(), cached=CachedPrefix(H, pages))
    engine.step() / run_until_done()
    engine.add_request("r", prompt, SamplingParams(), cached=CachedPrefix(H, pages, rings))  # exact hit
    engine.export_request / reserve / import_request / take_full_pages / take_ring_snapshots

``EngineService`` drives an engine from asyncio and is the only way roles reach one: its calls,
its ``shape`` (an ``EngineShape``: fixed sizes and the hash chain) and its ``load`` (the latest
``EngineLoad``). Roles import the names below from ``dsi.engine`` (and ``dsi.engine.params``),
never the engine's own modules. Names are imported lazily, so that ``dsi.engine.params`` stays
importable without loading torch.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "CachedPrefix": "prefix",
    "Engine": "engine",
    "EngineConfig": "engine",
    "EngineLoad": "load",
    "EngineService": "service",
    "EngineShape": "shape",
    "EngineStats": "prefix",
    "FullPage": "prefix",
    "ImageEmbeds": "images",
    "MachineFingerprint": "fingerprint",
    "RequestMoved": "service",
    "RequestOutput": "engine",
    "RequestState": "transfer",
    "RequestStats": "prefix",
    "RingSnapshot": "prefix",
    "Reservation": "transfer",
    "SamplingParams": "params",
    "StateLayout": "transfer",
    "exact_hit_limit": "prefix",
    "load_curve": "step_curve",
    "machine_fingerprint": "fingerprint",
    "step_thread": "service",
    "unpacked_images": "images",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'dsi.engine' has no attribute {name!r}")
    return getattr(import_module(f"dsi.engine.{home}"), name)
