"""TileWorkers: a product's tiles shared out among threads that each run one OpenMP thread give
the bits of one call per tile, restore the caller's thread count and pass errors back."""

import os
import subprocess
import sys
import threading

import pytest
import torch

from dsi.engine.gemm import PackedGemm
from dsi.engine.invariant import ROW_TILE
from dsi.engine.tile_workers import TileWorkers, tile_workers, waits_passively

pytestmark = pytest.mark.skipif(not tile_workers().available, reason="torch's OpenMP is not libgomp here")


@pytest.fixture
def shared():
    """The process's shared workers, enabled for the test (this test process's libgomp spins)."""
    workers = tile_workers()
    before = workers.enabled
    workers.enabled = True
    yield workers
    workers.enabled = before


def test_workers_share_only_where_libgomp_waits_passively(threads):
    assert waits_passively({"OMP_WAIT_POLICY": "PASSIVE"}) and waits_passively({"OMP_WAIT_POLICY": "passive"})
    assert waits_passively({"GOMP_SPINCOUNT": "0", "OMP_WAIT_POLICY": "ACTIVE"})
    assert not waits_passively({}) and not waits_passively({"OMP_WAIT_POLICY": "ACTIVE"})
    assert not waits_passively({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"})
    threads(2)
    assert TileWorkers(enabled=False).threads() == 1
    assert not TileWorkers(enabled=False).run(lambda i: None, 8)


def test_every_tile_runs_once_on_several_threads_each_with_one_openmp_thread(threads):
    threads(2)
    seen: dict[int, tuple[int, int]] = {}

    def tile(i: int) -> None:
        seen[i] = (threading.get_ident(), torch.get_num_threads())

    assert TileWorkers(enabled=True).run(tile, 7)
    assert sorted(seen) == list(range(7))
    assert len({ident for ident, _ in seen.values()}) == 2
    assert {n for _, n in seen.values()} == {1}
    assert torch.get_num_threads() == 2  # the caller's count is back


def test_one_thread_or_one_tile_is_left_to_the_caller(threads):
    workers = TileWorkers(enabled=True)
    threads(1)
    assert not workers.run(lambda i: None, 8)
    threads(2)
    assert not workers.run(lambda i: None, 1)


def test_a_worker_error_reaches_the_caller(threads):
    threads(2)

    def tile(i: int) -> None:
        if i == 3:
            raise ValueError("tile 3")

    with pytest.raises(ValueError, match="tile 3"):
        TileWorkers(enabled=True).run(tile, 4)
    assert torch.get_num_threads() == 2


def test_a_second_caller_while_busy_computes_its_own_tiles(threads):
    threads(2)
    workers = TileWorkers(enabled=True)
    inside, leave = threading.Event(), threading.Event()

    def slow(i: int) -> None:
        inside.set()
        leave.wait(10)

    first = threading.Thread(target=workers.run, args=(slow, 2))
    first.start()
    assert inside.wait(10)
    assert not workers.run(lambda i: None, 4)  # busy: no waiting
    leave.set()
    first.join(10)
    assert workers.run(lambda i: None, 4)


@pytest.mark.parametrize("m", [17, 32, 100, 1440])
def test_shared_tiles_equal_one_call_per_tile_in_inference_mode(threads, shared, m):
    torch.manual_seed(m)
    w = torch.randn(576, 1536)
    x = torch.randn(m, 576)
    mm = PackedGemm([w])
    threads(1)  # one thread: every tile one call from this thread
    with torch.inference_mode():
        want = mm(x, w)
    threads(2)
    with torch.inference_mode():
        got = mm(x, w)
    assert got.shape == (m, 1536) and torch.equal(got, want)
    assert -(-m // ROW_TILE) >= 2


def test_a_fresh_thread_shares_among_torchs_threads_not_the_environments():
    """A thread's OpenMP count starts at OMP_NUM_THREADS; torch sets its own on the thread's first
    call. Under OMP_NUM_THREADS=1 with torch at two threads, a fresh thread (an engine's scheduling
    thread) still shares its tiles out in two."""
    code = """
import threading, torch
from dsi.engine.tile_workers import TileWorkers
torch.set_num_threads(2)
workers = TileWorkers(enabled=True)
seen = {}
def tile(i):
    seen[i] = threading.get_ident()
got = []
thread = threading.Thread(target=lambda: got.append((workers.threads(), workers.run(tile, 4))))
thread.start(); thread.join()
print(got[0][0], got[0][1], len(set(seen.values())))
"""
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "True", "2"]
