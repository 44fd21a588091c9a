"""What one process holds, read from /proc and /dev/shm: resident memory, open fds, shm bytes.

The shared-memory files dsi creates are named ``dsi-<kind>-<creator pid>-<hex>``
(``dsi.kvcache.shm.HostBuffer.create``: ShmPool, the shm data plane), so each file is counted against the process that created it; a
file whose creator is gone is an orphan (a killed process never unlinks its files).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dsi.kvcache.shm import SHM_DIR, creator_pid


@dataclass(frozen=True, slots=True)
class ProcFigures:
    """One process at one moment. ``rss_bytes``: VmRSS; ``fds``: entries of /proc/<pid>/fd;
    ``shm_bytes``: bytes allocated by the /dev/shm files it created; ``shm_files``: their count."""

    pid: int
    rss_bytes: int
    fds: int
    shm_bytes: int
    shm_files: int

    def to_json(self) -> dict:
        return asdict(self)


def shm_by_pid(shm_dir: Path = SHM_DIR) -> dict[int, tuple[int, int]]:
    """Creator pid -> (bytes allocated, files) over the dsi files in `shm_dir`."""
    found: dict[int, tuple[int, int]] = {}
    for entry in os.scandir(shm_dir):
        pid = creator_pid(entry.name)
        if pid is None:
            continue
        try:
            allocated = entry.stat().st_blocks * 512  # a sparse file costs what it touched
        except FileNotFoundError:  # unlinked meanwhile
            continue
        total, files = found.get(pid, (0, 0))
        found[pid] = (total + allocated, files + 1)
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def figures(pid: int, shm: dict[int, tuple[int, int]]) -> ProcFigures | None:
    """The figures of `pid` (None when it is gone); `shm` from ``shm_by_pid``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    rss_kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)
    shm_bytes, shm_files = shm.get(pid, (0, 0))
    return ProcFigures(pid, rss_kb * 1024, fds, shm_bytes, shm_files)


def orphan_shm(shm: dict[int, tuple[int, int]], pids: set[int]) -> tuple[int, int]:
    """(bytes, files) of the shm files created by any of `pids` that no longer run."""
    gone = [shm[pid] for pid in pids if pid in shm and not alive(pid)]
    return sum(b for b, _ in gone), sum(f for _, f in gone)
