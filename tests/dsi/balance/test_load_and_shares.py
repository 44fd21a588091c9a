"""The load snapshot's validation, the shared apportioning rules, the worked examples of every
module docstring, and the package's import promise (no torch, no asyncio)."""

import doctest
import importlib
import itertools
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsi.balance import InstanceLoad, NoInstance
from dsi.balance.shares import apportion, moved, neighbour_groups, normalise
from dsi.errors import error_from_info


@pytest.mark.parametrize("module", ["shares", "cost", "prefill", "decode", "vision"])
def test_worked_examples_print_what_the_docstrings_say(module):
    result = doctest.testmod(importlib.import_module(f"dsi.balance.{module}"))
    assert result.attempted > 0 and result.failed == 0


def test_instance_load_names_every_bad_field():
    with pytest.raises(ValueError, match=r"instance 'd0': .*capacity"):
        InstanceLoad(id="d0", role="decode")
    with pytest.raises(ValueError, match=r"role must be one of prefill, decode, encoder"):
        InstanceLoad(id="x", role="gateway")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"state must be .*'ready'.*queued_tokens must be >= 0"):
        InstanceLoad(id="p", role="prefill", state="ready", queued_tokens=-1)  # type: ignore[arg-type]
    assert not InstanceLoad(id="p", role="prefill", state="draining").serving


def test_no_instance_travels_by_its_code():
    err = error_from_info(NoInstance("none").info())
    assert isinstance(err, NoInstance) and err.code == "no_instance"


def test_apportion_gives_one_each_then_follows_load():
    assert apportion([0.55, 0.30, 0.15, 0.0], 3) == [1, 1, 1, 0]
    assert apportion([0.55, 0.30, 0.15, 0.0], 8) == [4, 3, 1, 0]
    assert apportion([0.0, 0.0], 5) == [0, 0]
    with pytest.raises(ValueError, match="cannot give one to each of 3"):
        apportion([0.5, 0.3, 0.2], 2)


@given(st.lists(st.floats(0, 1), min_size=1, max_size=4), st.integers(1, 9))
def test_apportion_minimises_the_largest_load_per_instance(weights, n):
    loaded = [i for i, w in enumerate(weights) if w > 0]
    if n < len(loaded) or not loaded:
        return
    counts = apportion(weights, n)
    assert sum(counts) == n and all((c > 0) == (w > 0) for c, w in zip(counts, weights, strict=True))
    worst = max(weights[i] / counts[i] for i in loaded)
    for split in itertools.product(range(1, n + 1), repeat=len(loaded)):
        if sum(split) == n:
            assert worst <= max(weights[i] / c for i, c in zip(loaded, split, strict=True)) + 1e-12


def test_neighbour_groups_cut_the_loaded_buckets_into_light_runs():
    assert neighbour_groups([0.4, 0.3, 0.2, 0.1], 2) == [(0,), (1, 2, 3)]
    assert neighbour_groups([0.1, 0.2, 0.3, 0.4], 2) == [(0, 1, 2), (3,)]
    # an empty bucket is skipped; both cuts weigh 0.6 at most, the first one is taken
    assert neighbour_groups([0.4, 0.0, 0.2, 0.4], 2) == [(0,), (2, 3)]
    assert neighbour_groups([0.4, 0.3, 0.2, 0.1], 9) == [(0,), (1,), (2,), (3,)]
    assert neighbour_groups([0.0, 0.0], 3) == []


def test_moved_is_strictly_more_than_the_threshold():
    assert not moved([0.5, 0.5], [0.75, 0.25], 0.25)
    assert moved([0.5, 0.5], [0.875, 0.125], 0.25)
    assert normalise([1.0, 3.0]) == (0.25, 0.75) and normalise([0.0, 0.0]) == (0.0, 0.0)


def test_policies_import_without_torch_or_asyncio():
    code = (
        "import sys, dsi.balance; print(sorted(m for m in ('torch', 'asyncio', 'zmq') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
