"""RoleProcess: the environment a role process starts with."""

from __future__ import annotations

import asyncio
import sys

import pytest

from dsi.provision.process import RoleProcess

SAY_POLICY = "import os; print('READY', os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), flush=True)"


async def _policy_seen_by_child() -> str:
    child = await RoleProcess.spawn("probe", [sys.executable, "-c", SAY_POLICY])
    try:
        return await child.ready(30.0)
    finally:
        await child.terminate(5.0)
        await child.close()


@pytest.mark.parametrize(
    ("policy", "spins", "seen"),
    [(None, None, "PASSIVE None"), ("ACTIVE", None, "ACTIVE None"), (None, "10000", "None 10000")],
)
def test_openmp_threads_wait_passively_unless_the_environment_says(monkeypatch, policy, spins, seen):
    """Roles sharing a host's cores: a child's OpenMP threads sleep while they wait, unless the
    operator's environment chose a policy or a spin count."""
    for name, value in (("OMP_WAIT_POLICY", policy), ("GOMP_SPINCOUNT", spins)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert asyncio.run(_policy_seen_by_child()).strip() == seen
