"""The cluster a soak runs: ``dsi serve`` as a child process on a private copy of a config.

The copy moves every 127.0.0.1 port to a free one and the config's ``../run/`` paths (the
kvstore's directory) under a private directory, except the model directory, which stays
shared (the tiny model is generated once). ``dsi serve`` runs in a session of its own; its
stderr (every role's log) goes to ``serve.log`` in that directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from dsi.cli.status import ControllerUnreachable, fetch_instances
from dsi.config import EntrypointOptions, NodeConfig, load_config
from dsi.messages.control import InstanceInfo
from dsi.roles.curve import client_keys
from dsi.transport.ports import free_port


def private_config(source: Path, workdir: Path) -> Path:
    """A copy of `source` in `workdir` on free 127.0.0.1 ports, with its run directory there."""
    text = source.read_text()
    ports: dict[str, int] = {}
    text = re.sub(
        r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports.setdefault(m.group(1), free_port())}", text
    )

    def path(match: re.Match[str]) -> str:
        value = match.group(2)
        if match.group(1) == "dir" or Path(value).is_absolute():  # the model: shared
            return f'{match.group(1)} = "{(source.parent / value).resolve()}"'
        return f'{match.group(1)} = "{workdir / "run" / Path(value).name}"'

    text = re.sub(r'(?m)^(\w+) = "(\.\.?/[^"]*)"', path, text)
    out = workdir / source.name
    out.write_text(text)
    return out


class ServedCluster:
    """``dsi serve --config <config>`` and what the controller says about it."""

    def __init__(self, config: Path, workdir: Path) -> None:
        self.config = config
        self.cfg: NodeConfig = load_config(config)
        self.log_path = workdir / "serve.log"
        self.proc: subprocess.Popen | None = None
        self._keys = client_keys(self.cfg.security)

    @property
    def gateway(self) -> str:
        for role in self.cfg.roles:
            if isinstance(role.options, EntrypointOptions):
                return f"http://{role.options.http_host}:{role.options.http_port}"
        raise ValueError(f"{self.config}: no entrypoint role, nothing to send load to")

    def start(self, ready_timeout_s: float = 120.0, preexec: Callable[[], None] | None = None) -> str:
        """Start serve; its banner line once every role is up (RuntimeError if it exits first).
        ``preexec`` runs in the child before serve (dsi.bench.pinning.pinned: its cores)."""
        cmd = [
            sys.executable,
            "-m",
            "dsi.cli.main",
            "serve",
            "--config",
            str(self.config),
            "--ready-timeout",
            str(ready_timeout_s),
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                text=True,
                preexec_fn=preexec,
            )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("dsi serve: gateway"):
            raise RuntimeError(
                f"dsi serve exited with {self.proc.wait()} before it was up; see {self.log_path}"
            )
        return line.strip()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def table(self, timeout: float = 2.0) -> list[InstanceInfo] | None:
        """The controller's instances, or None while it cannot be reached."""
        try:
            return (await fetch_instances(self.cfg.cluster.controller, self._keys, timeout)).instances
        except ControllerUnreachable:
            return None

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGINT serve and wait for it (it stops every role); SIGKILL its group after `timeout_s`.
        Its exit code, or None when it had to be killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def wait_gone(pids: set[int], timeout_s: float, alive) -> set[int]:
    """The pids of `pids` still running after up to `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while (left := {pid for pid in pids if alive(pid)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
