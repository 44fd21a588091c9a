"""The faults of ``dsi bench chaos``, each with how it is made and undone.

    name               inject                                        heal (after --fault-s)
    partition-kv       blackhole routes decode-0 host <-> kvstore     routes removed
    delay-loss         100 ms + 2% loss on every packet among the     netem removed / shapers
                       prefill, decode and kvstore hosts              stopped
    partition-prefill  blackhole routes gateway host <-> prefill-0    routes removed
    sigstop            SIGSTOP decode-1                               SIGCONT
    kv-full            a filler file takes the kvstore tmpfs's last   filler removed
                       byte
    controller         SIGKILL controller-0 (its serve starts a new   (instant: none)
                       one)

A fault has ``instant`` set when it has no duration: its recovery is counted from its start.
Every fault leaves capacity by design (two prefills, two decodes; a decode that cannot persist
still serves); the bench checks this against the controller's table.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dsi.bench.chaos_cluster import ChaosCluster

DATA_HOSTS = ("p0", "p1", "d0", "d1", "kv")
DELAY_MS, LOSS = 100.0, 0.02


@dataclass(slots=True)
class FaultSkipped(RuntimeError):
    """The fault cannot be made here; the message says why."""


@dataclass(slots=True)
class FaultRun:
    """What a fault needs: the cluster (its fabric), the role pids now, and what it left to undo."""

    cluster: ChaosCluster
    pids: Callable[[], dict[str, int]]
    undo: list[Callable[[], None]] = field(default_factory=list)
    how: str = ""


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    instant: bool
    inject: Callable[[FaultRun], None]

    def heal(self, run: FaultRun) -> None:
        while run.undo:
            with contextlib.suppress(Exception):  # every undo runs, whatever one of them raised
                run.undo.pop()()


def _partition(a: str, b: str, what: str) -> Callable[[FaultRun], None]:
    def inject(run: FaultRun) -> None:
        fabric = run.cluster.fabric
        fabric.partition(a, b)
        run.undo.append(lambda: fabric.heal(a, b))
        run.how = (
            f"{what}: blackhole routes in both namespaces ({fabric.address(a)} <-> {fabric.address(b)}); "
            "packets between the two hosts are discarded by the sending kernel"
        )

    return inject


def has_netem(run: FaultRun, host: str) -> bool:
    """Whether the kernel has sch_netem: a netem qdisc on ``host``'s device is added (and kept)."""
    fabric = run.cluster.fabric
    cmd = ["tc", "-n", fabric.namespace(host), "qdisc", "add", "dev", fabric.device(host), "root", "netem",
           "delay", f"{DELAY_MS:g}ms", "loss", f"{LOSS * 100:g}%"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, timeout=10).returncode == 0


def _delay_loss(run: FaultRun) -> None:
    fabric = run.cluster.fabric
    if has_netem(run, DATA_HOSTS[0]):
        for host in DATA_HOSTS:
            if host != DATA_HOSTS[0]:
                has_netem(run, host)
            dev, ns = fabric.device(host), fabric.namespace(host)
            run.undo.append(lambda d=dev, n=ns: _tc_del(n, d))
        run.how = (
            f"netem on each of {', '.join(DATA_HOSTS)}: delay {DELAY_MS:g}ms loss {LOSS:.0%} on every "
            "packet the host sends (all its peers, the gateway host included)"
        )
        return
    for host in DATA_HOSTS:
        others = [fabric.address(h) for h in DATA_HOSTS if h != host]
        cmd = [*fabric.exec_prefix(host), sys.executable, "-m", "dsi.bench.chaos_shaper",
               "--device", fabric.device(host), "--net", fabric.net, "--delay-ms", f"{DELAY_MS:g}",
               "--loss", f"{LOSS:g}", "--seed", str(len(run.undo))]  # fmt: skip
        for dst in others:
            cmd += ["--dst", dst]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        run.undo.append(lambda p=proc: _stop(p))
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "READY":
            raise RuntimeError(
                f"the shaper on {host} did not start: {proc.stderr.read() if proc.stderr else ''}"
            )
    run.how = (
        "no sch_netem in this kernel: on each of the prefill, decode and kvstore hosts a userspace "
        "shaper (dsi.bench.chaos_shaper) takes every IP packet the host sends to the other four "
        f"through a TUN device, drops it with p={LOSS:g} (TCP retransmits it on its own timeout) "
        f"and forwards the rest {DELAY_MS:g} ms later in order: {2 * DELAY_MS:g} ms more round trip "
        "between those hosts; the gateway/controller host's traffic is not shaped"
    )


def _tc_del(ns: str, dev: str) -> None:
    subprocess.run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=10)


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _sigstop(role: str) -> Callable[[FaultRun], None]:
    def inject(run: FaultRun) -> None:
        pid = run.pids()[role]
        os.kill(pid, signal.SIGSTOP)
        run.undo.append(lambda: _cont(pid))
        run.how = f"SIGSTOP {role} (pid {pid}), SIGCONT at the end of the fault (if it still exists)"

    return inject


def _cont(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)


def _kv_full(run: FaultRun) -> None:
    if not run.cluster.kv_mounted:  # filling a plain directory would fill the machine's disk
        raise FaultSkipped("mount is not permitted here, so the kvstore has no tmpfs of its own to fill")
    store: Path = run.cluster.store
    filler = store / "chaos-filler"
    try:
        _fill(filler)
        already = ""
    except OSError:  # not even a new file fits
        already = " (it was full already: the filler could not be created)"
    run.undo.append(lambda: filler.unlink(missing_ok=True))
    run.how = (
        f"the kvstore's directory (a tmpfs) filled by {filler.name} until ENOSPC; removed at the end{already}"
    )


def _fill(path: Path) -> None:
    """Write ``path`` until the filesystem has no byte left (ENOSPC is expected, not raised)."""
    with open(path, "wb", buffering=0) as f:  # unbuffered: nothing is left to fail at close
        for size in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * size)


def _controller(run: FaultRun) -> None:
    pid = run.pids()["controller-0"]
    os.kill(pid, signal.SIGKILL)
    run.how = f"SIGKILL controller-0 (pid {pid}); the gateway host's dsi serve starts a new one"


FAULTS = {
    f.name: f
    for f in (
        Fault("partition-kv", False, _partition("d0", "kv", "decode-0 <-> kvstore-0")),
        Fault("delay-loss", False, _delay_loss),
        Fault("partition-prefill", False, _partition("gw", "p0", "entrypoint-0 <-> prefill-0")),
        Fault("sigstop", False, _sigstop("decode-1")),
        Fault("kv-full", False, _kv_full),
        Fault("controller", True, _controller),
    )
}
