"""How a vLLM role wires dsi's connector into vLLM, and the per-request parameters it reads.

The connector (:mod:`dsi.vllm.connector`) runs inside vLLM's own processes (the scheduler half in
the engine core, the worker half in each worker); the role talks to it through two channels only:

- ``kv_transfer_config`` at start: the connector class and its ``staging`` directory (where it
  writes ``layout.json`` once the KV cache exists, and the KV files of transfers), plus the pid
  of the role (vLLM's processes end with it, see the connector);
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


def connector_wiring(kind: str, staging: Path) -> dict[str, Any]:
    """The AsyncEngineArgs fields dsi sets for its connector (see the module docstring)."""
    from vllm.config import KVTransferConfig

    transfer = KVTransferConfig(
        kv_connector=CONNECTOR,
        kv_connector_module_path=CONNECTOR_MODULE,
        kv_role="kv_both",
        kv_connector_extra_config={"staging": str(staging), "parent_pid": os.getpid(), "kind": kind},
    )
    return {"kv_transfer_config": transfer, "block_size": BLOCK_SIZE}


def save_params(path: Path) -> dict[str, Any]:
    """Stage the prompt's KV blocks (all of them, every layer) into ``path`` when its prefill completes."""
    return {KEY: {"save": str(path)}}


def load_params(path: Path, tokens: int, blocks: int) -> dict[str, Any]:
    """The first ``tokens`` prompt tokens are in ``path`` (``blocks`` whole blocks, as
    ``save_params`` wrote them): vLLM loads them instead of computing them."""
    return {KEY: {"load": str(path), "tokens": tokens, "blocks": blocks}}


def hit_params(save: Path, hit: Path, tokens: int, blocks: int) -> dict[str, Any]:
    """``save_params(save)``, and when ``tokens`` > 0 also ``load_params(hit, tokens, blocks)``:
    a prefill that loads its store hit and stages the whole prompt."""
    params = save_params(save)
    if tokens > 0:
        params[KEY].update(load_params(hit, tokens, blocks)[KEY])
    return params
