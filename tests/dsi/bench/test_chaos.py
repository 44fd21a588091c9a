"""``dsi bench chaos`` on six network namespaces with short faults: a decode cut off from the
kvstore, a SIGSTOPped decode and the gateway cut off from a prefill. Capacity is left in each,
so no request may fail, none may differ from the undisturbed reference, and the rate must come
back. Every namespace, serve process and mount the bench made is gone afterwards (the teardown
removes any it left: it names them by the bench's pid and its workdir)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsi.bench.chaos_netns import Fabric, NetnsUnavailable
from dsi.kvcache.shm import remove_files_of

pytestmark = [pytest.mark.netns, pytest.mark.slow]

FAULTS = ("partition-kv", "sigstop", "partition-prefill")


def namespaces(tag: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(tag)]


def pids_using(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (the serves and roles of one bench)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if str(path).encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    found.append(int(entry))
    return found


@pytest.fixture
def netns_permitted():
    try:
        Fabric.create(pid=os.getpid()).close()
    except NetnsUnavailable as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")


def test_short_faults_lose_and_splice_nothing_and_leave_nothing_behind(tmp_path, netns_permitted):
    workdir = tmp_path / "chaos"
    cmd = [sys.executable, "-m", "dsi.cli.main", "bench", "chaos", "--json", "--faults", ",".join(FAULTS),
           "--fault-s", "3", "--baseline-s", "3", "--window-s", "2", "--recover-max-s", "20",
           "--load", "2", "--prompts", "6", "--workdir", str(workdir)]  # fmt: skip
    bench = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = f"dc{bench.pid}"
    try:
        out, err = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        killed = pids_using(workdir)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in killed:  # a killed role never unlinks its /dev/shm files
            remove_files_of(pid)
        subprocess.run(["umount", "-l", str(workdir / "kvstore")], capture_output=True)
        left = namespaces(tag)
        for ns in left:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{tag}br"], capture_output=True)
    assert bench.returncode in (0, 1), err[-3000:]
    report = json.loads(out)
    rows = {row["fault"]: row for row in report["faults"]}
    assert list(rows) == list(FAULTS)
    for row in rows.values():
        assert row["sent"] > 0, row
        assert row["capacity_left"], row
        assert (row["failed"], row["spliced"]) == (0, 0), row
        assert row["recovery_s"] is not None, row
    assert report["spliced_outside"] == 0
    assert report["serve_exit"] == {host: 0 for host in ("p0", "p1", "d0", "d1", "kv", "gw")}
    assert left == [] and killed == []  # the bench removed its namespaces and processes itself
    assert not os.path.ismount(workdir / "kvstore")
