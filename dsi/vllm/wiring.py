"""How a vLLM role wires dsi's connector into vLLM, and the per-request parameters it reads.

The connector (:mod:`dsi.vllm.connector`) runs inside vLLM's own processes (the scheduler half in
the engine core, the worker half in each worker); the role talks to it through two channels only:

- ``kv_transfer_config`` at start: the connector class and its ``staging`` directory (where it
  writes ``layout.json`` once the KV cache exists, and the KV files of transfers), plus the pid
  of the role (vLLM's processes end with it, see the connector); and ``kv_events_config``: vLLM
  publishes its prefix cache's stored and evicted blocks on ``events_endpoint(staging)`` (see
  dsi.vllm.events);
- ``kv_transfer_params`` per request (vLLM's ``SamplingParams.extra_args``), under the key
  ``"dsi"``: ``save_params`` (stage the prompt's blocks when its prefill completes) or
  ``load_params`` (the first ``tokens`` prompt tokens are in a staged file: load, do not compute).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

CONNECTOR = "DsiConnector"
CONNECTOR_MODULE = "dsi.vllm.connector"
BLOCK_SIZE = 128  # tokens per vLLM KV block: dsi's page, so one block is one hash-chain link
KEY = "dsi"
SHM = Path("/dev/shm")


def staging_dir(role_id: str, bind: str) -> Path:
    """The role's staging directory in shared memory (named by role id and address, so that two
    clusters on one host never share one)."""
    tag = hashlib.sha1(bind.encode()).hexdigest()[:8]
    root = SHM if SHM.is_dir() else Path("/tmp")
    return root / f"dsi-vllm-{role_id}-{tag}"


def events_endpoint(staging: Path) -> str:
    """Where vLLM publishes its KV events (an ipc socket in the staging directory)."""
    return f"ipc://{staging / 'kv-events'}"


def connector_wiring(kind: str, staging: Path) -> dict[str, Any]:
    """The AsyncEngineArgs fields dsi sets for its connector (see the module docstring)."""
    from vllm.config import KVEventsConfig, KVTransferConfig

    transfer = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role="kv_both",
        kv_connector_extra_config={"staging": str(staging), "parent_pid": os.getpid(), "kind": kind},
    )
    events = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=events_endpoint(staging))
    return {"kv_transfer_config": transfer, "kv_events_config": events, "block_size": BLOCK_SIZE}


def save_params(path: Path, first: int = 0, full_only: bool = False) -> dict[str, Any]:
    """Stage the prompt's KV blocks from block ``first`` on (every layer) into ``path`` when its
    prefill completes; with ``full_only`` its full blocks only (what the store keeps), else its
    last, partly filled block too (what a handoff's decode loads)."""
    params: dict[str, Any] = {"save": str(path), "save_first": first}
    if full_only:
        params["save_full"] = True
    return {KEY: params}


def load_params(path: Path, tokens: int, blocks: int, first: int = 0) -> dict[str, Any]:
    """The prompt tokens up to ``tokens`` from block ``first`` on are in ``path`` (``blocks`` whole
    blocks, as ``save_params`` wrote them): vLLM loads them instead of computing them, when its
    own prefix cache holds the blocks before ``first``."""
    return {KEY: {"load": str(path), "tokens": tokens, "blocks": blocks, "load_first": first}}


def hit_params(
    save: Path,
    hit: Path,
    tokens: int,
    blocks: int,
    first: int = 0,
    save_from: int = 0,
    full_only: bool = False,
) -> dict[str, Any]:
    """``save_params(save, save_from, full_only)``, and when ``blocks`` > 0 also
    ``load_params(hit, tokens, blocks, first)``: a run that loads its store hit (the blocks past
    the ``first`` vLLM holds itself) and stages the prompt's blocks from ``save_from`` on."""
    params = save_params(save, save_from, full_only)
    if blocks > 0:
        params[KEY].update(load_params(hit, tokens, blocks, first)[KEY])
    return params
