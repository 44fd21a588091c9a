"""The API keys' in-flight slots: one worker's count, and the table the HTTP workers of a role
share, with its limit over every worker, a dead worker's row freed and a dead lock holder."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dsi.kvcache.shm import SHM_DIR, remove_files_of
from dsi.roles.entrypoint.auth import ApiKeys, KeyEntry, TooManyRequests
from dsi.roles.entrypoint.key_slots import LocalSlots, SharedSlots


def test_a_lone_worker_counts_each_key_up_to_its_limit():
    slots = LocalSlots(2)
    assert slots.take(0, 2) and slots.take(0, 2) and not slots.take(0, 2)
    assert slots.take(1, 1) and slots.held(0) == 2
    slots.give(0)
    assert slots.take(0, 2)


def test_the_limit_holds_over_every_worker_of_the_table():
    table = SharedSlots.create(workers=4, keys=2)
    workers = [table] + [SharedSlots.attach(table.name, i, 4, 2) for i in (1, 2, 3)]
    try:
        assert workers[1].take(0, 2) and workers[2].take(0, 2)
        assert not any(w.take(0, 2) for w in workers)  # every worker sees the two others hold
        assert workers[3].take(1, 2)  # another key has its own column
        assert table.held(0) == 2 and table.total() == 3
        workers[2].give(0)
        assert workers[0].take(0, 2) and not workers[3].take(0, 2)
    finally:
        for w in reversed(workers):
            w.close()
    assert not (SHM_DIR / table.name).exists()  # the creator removes the file


def test_a_dead_workers_row_is_cleared_and_its_slots_come_back():
    table = SharedSlots.create(workers=2, keys=1)
    other = SharedSlots.attach(table.name, 1, 2, 1)
    try:
        assert other.take(0, 1) and not table.take(0, 1)
        table.clear(1)  # worker 1 exited holding its slot: nothing of it will give it back
        assert table.take(0, 1)
    finally:
        other.close()
        table.close()


def test_a_killed_lock_holder_blocks_no_one():
    table = SharedSlots.create(workers=2, keys=1)
    holder = subprocess.Popen(
        [sys.executable, "-c", (
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(SHM_DIR / table.name)!r}, os.O_RDWR)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n"
        )],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(10)
        t0 = time.monotonic()
        assert table.take(0, 1)  # the kernel released the dead holder's lock
        assert time.monotonic() - t0 < 1.0
    finally:
        holder.kill()
        holder.wait()
        table.close()


def test_the_table_of_a_role_killed_outright_is_removed_with_its_files():
    creator = subprocess.Popen(
        [sys.executable, "-c", (
            "import time\n"
            "from dsi.roles.entrypoint.key_slots import SharedSlots\n"
            "print(SharedSlots.create(workers=2, keys=1).name, flush=True)\n"
            "time.sleep(60)\n"
        )],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert creator.stdout is not None
        path = SHM_DIR / creator.stdout.readline().decode().strip()
        assert path.exists()
        creator.kill()
        creator.wait(10)
        assert remove_files_of(creator.pid)[1] == 1  # what a provisioner does for a dead role
        assert not path.exists()
    finally:
        creator.kill()
        creator.wait()


def test_api_keys_count_in_the_slots_they_are_given():
    entries = (KeyEntry("sk-a", "team-a", max_concurrency=1), KeyEntry("sk-b", "team-b", max_concurrency=3))
    table = SharedSlots.create(workers=2, keys=2)
    other = SharedSlots.attach(table.name, 1, 2, 2)
    try:
        here, there = ApiKeys(entries, slots=table), ApiKeys(entries, slots=other)
        a = here.authenticate("Bearer sk-a", None)
        assert a is not None and a.index == 0
        there.acquire(there.callers["sk-a"])
        with pytest.raises(TooManyRequests, match="team-a: 1 requests already in flight"):
            here.acquire(a)
        here.acquire(here.callers["sk-b"])
        assert here.in_flight(a) == 1 and there.in_flight(there.callers["sk-b"]) == 1
        there.release(there.callers["sk-a"])
        here.acquire(a)
    finally:
        other.close()
        table.close()
