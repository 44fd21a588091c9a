"""dsi's connector's worker half writes and reads staged KV files (run in the vLLM venv, where
the connector's module imports)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

VLLM_PYTHON = Path(__file__).resolve().parents[3] / ".venv-vllm" / "bin" / "python"

# The worker half without a vLLM config: its caches, layout and staging set by hand.
SCRIPT = r"""
import math, sys, tempfile
from pathlib import Path
from types import SimpleNamespace
import torch
from dsi.vllm.connector import BlockLoad, BlockSave, DsiConnector, DsiConnectorMeta, _Saving
from dsi.vllm.layout import KvLayout

def worker(caches, staging):
    c = object.__new__(DsiConnector)
    c._caches, c.staging, c.block_size = caches, staging, 4
    c._layer_index = {f"layers.{i}.attn": i for i in range(len(caches))}
    c._loading, c._overlap = None, True  # the accelerator's way: a thread copies beside the forward
    first = caches[0]
    c.layout = KvLayout(layers=len(caches), block_shape=tuple(first.shape[1:]),
                        dtype=str(first.dtype).removeprefix("torch."),
                        layer_block_bytes=first[0].numel() * first.element_size(),
                        block_size=4, num_blocks=first.shape[0])
    return c

staging = Path(tempfile.mkdtemp())
for dtype in (torch.float32, torch.bfloat16):
    torch.manual_seed(0)
    src = [torch.randn(6, 2, 4, 8).to(dtype) for _ in range(3)]  # [blocks, heads, block_size, 2*head]
    path = str(staging / f"r.{dtype}.kv")
    worker(src, staging)._save(BlockSave("r", [4, 1], path))
    assert not Path(path + ".part").exists()
    assert Path(path).stat().st_size == 2 * 3 * 2 * 4 * 8 * src[0].element_size()
    def step(w, *loads):
        w.bind_connector_metadata(DsiConnectorMeta(loads=list(loads)))
        w.start_load_kv(None)
    dst = [torch.zeros_like(t) for t in src]
    w = worker(dst, staging)
    step(w, BlockLoad("r", [0, 5], 0, path, 2))
    for layer in range(3):  # each layer is there once its wait returns
        w.wait_for_layer_load(f"layers.{layer}.attn")
        assert torch.equal(dst[layer][0], src[layer][4]) and torch.equal(dst[layer][5], src[layer][1])
    w.wait_for_save()
    for s, d in zip(src, dst):
        assert torch.equal(d[0], s[4]) and torch.equal(d[5], s[1]) and d[1:5].abs().sum() == 0
    dst = [torch.zeros_like(t) for t in src]
    w = worker(dst, staging)
    step(w, BlockLoad("r", [3], 1, path, 2))  # from the file's second block
    w.wait_for_layer_load("a layer it never registered")  # waits for every layer
    assert all(torch.equal(d[3], s[1]) for s, d in zip(src, dst))
    try:  # a file of the wrong size fails the step, at its start
        step(w, BlockLoad("r", [2], 0, path, 3))
        raise AssertionError("a short file was loaded")
    except ValueError as exc:
        assert "expected" in str(exc)
    w.wait_for_save()

# the scheduler half: a 10-token prompt in blocks of 4 stages 3 blocks, or its 2 full ones
for full_only, expected in ((False, [7, 8, 9]), (True, [7, 8])):
    c = object.__new__(DsiConnector)
    c.block_size, c._loads = 4, []
    c._saving = {"r": _Saving("/x", 10, 0, full_only)}
    new = SimpleNamespace(req_id="r", block_ids=([7, 8, 9],), num_computed_tokens=0)
    cached = SimpleNamespace(req_ids=[], new_block_ids=[], resumed_req_ids=set(), num_computed_tokens=[])
    out = SimpleNamespace(scheduled_new_reqs=[new], scheduled_cached_reqs=cached,
                          num_scheduled_tokens={"r": 10})
    meta = c.build_connector_meta(out)
    assert [s.block_ids for s in meta.saves] == [expected], (full_only, meta.saves)
print("ok")
"""


@pytest.mark.vllm
@pytest.mark.skipif(not VLLM_PYTHON.exists(), reason="no .venv-vllm (make venv-vllm)")
def test_staged_blocks_round_trip_and_a_colocated_save_stages_full_blocks_only(tmp_path):
    ran = subprocess.run(
        [str(VLLM_PYTHON), "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONSAFEPATH": "1", "HOME": str(tmp_path)},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.strip().endswith("ok")
