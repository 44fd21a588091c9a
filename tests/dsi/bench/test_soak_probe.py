"""The soak's per-process figures: this process's own, and shm files counted by creator pid."""

from __future__ import annotations

import os
import subprocess
import sys

from dsi.bench.soak_probe import alive, figures, orphan_shm, shm_by_pid
from dsi.kvcache.shm import HostBuffer


def test_figures_of_this_process_count_its_fds_and_the_shm_it_created(tmp_path):
    before = figures(os.getpid(), shm_by_pid())
    assert before is not None and before.rss_bytes > 10 << 20
    with HostBuffer.create(1 << 20, prefix="dsi-soaktest") as buf, open(tmp_path / "f", "w"):
        buf.numpy()[:] = 1  # touched: allocated, not just sized
        during = figures(os.getpid(), shm_by_pid())
        assert during is not None
        assert during.fds == before.fds + 2  # the open file, and the fd Python's mmap keeps
        assert during.shm_files == before.shm_files + 1
        assert during.shm_bytes - before.shm_bytes >= 1 << 20
    after = figures(os.getpid(), shm_by_pid())
    assert after is not None and after.shm_files == before.shm_files and after.fds == before.fds


def test_a_gone_process_has_no_figures_and_its_shm_files_are_orphans():
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os; from dsi.kvcache.shm import HostBuffer; "
            "b = HostBuffer.create(8192, prefix='dsi-soaktest'); b.numpy()[:] = 1; print(os.getpid())",
        ],
        capture_output=True,
        text=True,
        check=True,
    )  # exits without unlinking: as if killed
    pid = int(child.stdout)
    try:
        assert not alive(pid) and figures(pid, {}) is None
        nbytes, files = orphan_shm(shm_by_pid(), {pid, os.getpid()})
        assert files == 1 and nbytes >= 8192
    finally:
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"dsi-soaktest-{pid}-"):
                os.unlink(f"/dev/shm/{name}")
