"""The lock files that `make venv` and the peer benchmarks install from (requirements/README.md)."""

import re
import tomllib
from pathlib import Path

import pytest

from dsi import paths
from dsi.bench.peers_vllm import LOCK, VLLM_PINS

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"


def entries(path: Path) -> dict[str, tuple[str, int]]:
    """name -> (version, number of hashes) of each pinned entry of a lock file."""
    out: dict[str, tuple[str, int]] = {}
    name = ""
    for line in path.read_text().splitlines():
        pinned = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if pinned:
            name = re.sub(r"[-_.]+", "-", pinned.group(1)).lower()
            out[name] = (pinned.group(2), 0)
        elif "--hash=sha256:" in line and name:
            out[name] = (out[name][0], out[name][1] + 1)
    return out


@pytest.mark.parametrize("lock", ["dev.lock", "gemma.lock", "vllm.lock", "smollm2.lock"])
def test_every_entry_is_pinned_with_a_hash(lock):
    pinned = entries(LOCKS / lock)
    assert pinned
    assert all(hashes for _, hashes in pinned.values()), [n for n, (_, h) in pinned.items() if not h]


def test_the_dev_lock_covers_pyproject_and_pins_the_cpu_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    names = {re.sub(r"[-_.]+", "-", re.split(r"[<>=!~ \[;]", spec)[0]).lower() for spec in wanted}
    pinned = entries(LOCKS / "dev.lock")
    assert names <= pinned.keys(), names - pinned.keys()
    assert pinned["torch"][0] == "2.13.0+cpu"
    assert {"setuptools", "wheel", "kernels"} <= pinned.keys()  # the build backend; transformers' kernels


def test_the_vllm_lock_is_the_benchmarks_and_has_no_cuda_only_packages():
    lock = paths.shipped(LOCK)
    assert lock == LOCKS / "vllm.lock"
    pinned = entries(lock)
    for pin in VLLM_PINS:
        name, version = pin.split("==")
        assert pinned[name][0] == version
    assert not {"torchvision", "torchaudio", "torchcodec"} & pinned.keys()
