"""The cluster of a chaos bench: one ``dsi serve`` per host, as an operator runs one per machine.

    host gw: controller-0, entrypoint-0 (HTTP :8000)    host p0: prefill-0   host p1: prefill-1
    host d0: decode-0                                  host d1: decode-1    host kv: kvstore-0

Each host has a node config of its own roles (``<workdir>/<host>.toml``), every role bound on its
host's address (``chaos_netns``), CURVE on with one key set (``dsi keys create``'s layout) for
all, greedy outputs made comparable: ``batch_invariant = true`` and ``hit_policy = "exact"`` (a
prefix hit gives the hit-free tokens). The kvstore's directory (4 MiB segments) is a ``kv_mb`` MiB tmpfs mounted
before it starts (``kv_mounted`` False, with a plain directory, where mount is refused), so that
it can be made full. Every serve's stderr (its roles' logs) goes to ``<workdir>/<host>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dsi import paths
from dsi.bench.chaos_netns import Fabric
from dsi.cli.status import ControllerUnreachable, fetch_instances
from dsi.config import load_config
from dsi.messages.control import InstanceInfo
from dsi.roles.curve import client_keys
from dsi.transport.keyset import create_key_set

HTTP_PORT = 8000
_ROLES = {  # host -> (kind, id, port, extra lines)
    "gw": [
        ("controller", "controller-0", 7100, ""),
        ("entrypoint", "entrypoint-0", 7101, "http = '{addr}:8000'"),
    ],
    "p0": [("prefill", "prefill-0", 7110, "")],
    "p1": [("prefill", "prefill-1", 7111, "")],
    "d0": [("decode", "decode-0", 7120, "")],
    "d1": [("decode", "decode-1", 7121, "")],
    "kv": [
        (
            "kvstore",
            "kvstore-0",
            7130,
            "store_dir = '{store}'\nsegment_bytes = 4194304\npublish = 'tcp://{addr}:7131'",
        )
    ],
}
ROLE_HOST = {role_id: host for host, roles in _ROLES.items() for _, role_id, _, _ in roles}


def model_dir(source: Path | None = None) -> Path:
    """The tiny model's directory of ``source`` (default dsi's configs/local.toml), shared with
    every other local cluster."""
    return load_config(source or paths.config("local.toml")).model.dir


class ChaosCluster:
    """Configs, serve processes and the controller's view of one bench's cluster."""

    def __init__(self, fabric: Fabric, workdir: Path, kv_mb: int = 64) -> None:
        self.fabric, self.workdir = fabric, workdir
        self.store = workdir / "kvstore"
        self.store.mkdir(parents=True, exist_ok=True)
        self.kv_mounted = _mount_tmpfs(self.store, kv_mb)
        keys = create_key_set(workdir / "keys")
        self.security = keys.snippet()
        self.serves: dict[str, subprocess.Popen] = {}
        self.controller = f"tcp://{fabric.address('gw')}:7100"
        self.configs = {host: self._write_config(host) for host in _ROLES}
        self._keys = client_keys(load_config(self.configs["gw"]).security)

    @property
    def gateway(self) -> str:
        return f"http://{self.fabric.address('gw')}:{HTTP_PORT}"

    def _write_config(self, host: str) -> Path:
        addr = self.fabric.address(host)
        roles = "\n".join(
            f"[[roles]]\nkind = '{kind}'\nid = '{rid}'\nbind = 'tcp://{addr}:{port}'\n"
            + extra.format(addr=addr, store=self.store)
            + "\n"
            for kind, rid, port, extra in _ROLES[host]
        )
        text = f"""[cluster]
name = "chaos"
controller = "{self.controller}"
heartbeat_interval_s = 1.0
heartbeat_timeout_s = 6.0

{self.security}

[logging]
format = "text"
level = "info"

[model]
name = "dsi-tiny"
dir = "{model_dir()}"
config = "tiny"

[data_plane]
backend = "tcp"

[kvcache]
hit_policy = "exact"

[engine]
batch_invariant = true

{roles}"""
        path = self.workdir / f"{host}.toml"
        path.write_text(text)
        return path

    def start(self, ready_timeout_s: float = 180.0) -> None:
        """Start every host's serve at once (a role retries the controller until it answers);
        return once each printed its banner. RuntimeError naming a host whose serve exited first."""
        for host in _ROLES:
            self._spawn(host, ready_timeout_s)
        for host in _ROLES:
            self._banner(host)

    def _spawn(self, host: str, ready_timeout_s: float) -> None:
        cmd = [
            *self.fabric.exec_prefix(host),
            sys.executable,
            "-m",
            "dsi.cli.main",
            "serve",
            "--config",
            str(self.configs[host]),
            "--ready-timeout",
            str(ready_timeout_s),
        ]
        with open(self.workdir / f"{host}.log", "ab") as log:
            self.serves[host] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                text=True,
            )

    def _banner(self, host: str) -> None:
        proc = self.serves[host]
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("dsi serve: gateway"):
            code = proc.wait()
            tail = (self.workdir / f"{host}.log").read_text()[-2000:]
            raise RuntimeError(f"dsi serve on host {host} exited with {code} before it was up:\n{tail}")

    async def table(self, timeout: float = 2.0) -> list[InstanceInfo] | None:
        """The controller's instances, or None while it cannot be reached."""
        try:
            return (await fetch_instances(self.controller, self._keys, timeout)).instances
        except ControllerUnreachable:
            return None

    def serve_pids(self) -> dict[str, int]:
        return {f"serve-{host}": proc.pid for host, proc in self.serves.items() if proc.poll() is None}

    def stop(self, timeout_s: float = 40.0) -> dict[str, int | None]:
        """SIGINT every serve (each stops its roles), others before gw; SIGKILL a group that
        outlives ``timeout_s``. Exit code per host (None: killed)."""
        codes: dict[str, int | None] = {}
        order = [h for h in self.serves if h != "gw"] + (["gw"] if "gw" in self.serves else [])
        for host in order:
            proc = self.serves[host]
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        for host in order:
            proc = self.serves[host]
            try:
                codes[host] = proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                codes[host] = None
            if proc.stdout is not None:
                proc.stdout.close()
        return codes

    def close(self) -> None:
        """Unmount the kvstore's tmpfs (after stop; ``kv_mounted`` still says it was one)."""
        if self.kv_mounted and os.path.ismount(self.store):
            subprocess.run(["umount", "-l", str(self.store)], capture_output=True, timeout=30)


def _mount_tmpfs(path: Path, size_mb: int) -> bool:
    """Mount a ``size_mb`` MiB tmpfs on ``path``; False where mount is not permitted."""
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
        capture_output=True,
        timeout=30,
    )
    return done.returncode == 0
