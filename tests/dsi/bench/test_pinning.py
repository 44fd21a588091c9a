"""dsi.bench.pinning: the cores a peer benchmark gives each system."""

import os
import subprocess
import sys

import pytest

from dsi.bench.pinning import CoresUnavailable, cores_of, first_cores, pinned, spell


def test_all_ids_and_positions_name_allowed_cpus():
    allowed = [2, 3, 6, 7]
    assert cores_of("all", allowed) == [2, 3, 6, 7]
    assert cores_of("3,6-7", allowed) == [3, 6, 7]
    assert cores_of("@0", allowed) == [2]
    assert cores_of("@1-2", allowed) == [3, 6]


def test_cpus_off_the_allowed_set_and_bad_spellings_are_errors():
    with pytest.raises(CoresUnavailable, match="CPU 0"):
        cores_of("0", [2, 3])
    with pytest.raises(CoresUnavailable, match="position 2"):
        cores_of("@2", [2, 3])
    for bad in ("auto", "nobind", "0|1", "x", "3-1", ""):
        with pytest.raises(ValueError, match="--cores"):
            cores_of(bad, [0, 1, 2, 3])


def test_spelling_is_one_id_per_thread():
    assert spell([3, 1, 2, 1]) == "1,2,3"


def test_first_cores_stop_at_the_machines_count():
    assert list(first_cores(1)) == [0]
    assert len(first_cores(10_000)) == os.cpu_count()


def test_a_pinned_child_and_its_children_run_on_those_cpus_only():
    first = sorted(os.sched_getaffinity(0))[:1]
    code = "import os, subprocess, sys; print(sorted(os.sched_getaffinity(0))); sys.stdout.flush(); " + (
        "subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], preexec_fn=pinned(first), capture_output=True, text=True
    )
    assert out.stdout.split("\n")[:2] == [str(first), str(first)]
