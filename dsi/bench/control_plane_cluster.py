"""The real roles of ``dsi bench control-plane``: a controller, a balancer and an entrypoint, each
in its own ``dsi-role`` process, from one node config on free 127.0.0.1 ports.

    start:    controller -> balancer -> entrypoint, each waited for until it prints READY
    restart:  the controller is SIGKILLed (a crash: no goodbye, its table is gone), then started
              again on the same address; the others keep running
    stop:     entrypoint -> balancer -> controller (SIGTERM, SIGKILL after a grace period)

The processes are :class:`dsi.provision.process.RoleProcess` children: each runs in its own
session and gets SIGTERM when the bench dies, so none outlives it.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from dsi.provision.process import RoleProcess
from dsi.transport.ports import free_port

HOST = "127.0.0.1"
MODEL = "dsi-tiny"
ORDER = ("controller-0", "balancer-0", "entrypoint-0")
_STOP_GRACE_S = 10.0


@dataclass(slots=True, frozen=True)
class ControlPlaneConfig:
    """Addresses and heartbeat terms (seconds) of the three roles."""

    interval_s: float = 1.0
    timeout_s: float = 5.0
    controller: str = field(default_factory=lambda: f"tcp://{HOST}:{free_port()}")
    balancer: str = field(default_factory=lambda: f"tcp://{HOST}:{free_port()}")
    entrypoint: str = field(default_factory=lambda: f"tcp://{HOST}:{free_port()}")
    http_port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        if not 0 < self.interval_s < self.timeout_s:
            raise ValueError(f"need 0 < interval_s < timeout_s, got {self.interval_s} and {self.timeout_s}")

    @property
    def http(self) -> str:
        return f"http://{HOST}:{self.http_port}"

    def toml(self) -> str:
        """The node config: the three roles, the tiny model's table (the gateway's recipe and
        the balancer's prefill cost), warnings and errors logged only."""
        return f"""[cluster]
name = "bench-control-plane"
controller = "{self.controller}"
heartbeat_interval_s = {self.interval_s}
heartbeat_timeout_s = {self.timeout_s}

[logging]
level = "warning"

[model]
name = "{MODEL}"
config = "tiny"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "{self.controller}"

[[roles]]
kind = "balancer"
id = "balancer-0"
bind = "{self.balancer}"

[[roles]]
kind = "entrypoint"
id = "entrypoint-0"
bind = "{self.entrypoint}"
http = "{HOST}:{self.http_port}"
"""


class ControlPlane:
    """The three role processes of ``cfg``, its config written to ``path``."""

    def __init__(self, cfg: ControlPlaneConfig, path: Path) -> None:
        self.cfg = cfg
        self.path = path
        self.procs: dict[str, RoleProcess] = {}

    def pid(self, role_id: str) -> int:
        return self.procs[role_id].pid

    async def start(self, wait_s: float = 120.0) -> None:
        """Start the roles in order, each waited for until READY; StartFailed when one is not."""
        self.path.write_text(self.cfg.toml())
        for role_id in ORDER:
            await self._spawn(role_id, wait_s)

    async def kill_controller(self) -> None:
        """SIGKILL the controller's process group (a crash: no goodbye) and reap it."""
        old = self.procs.pop("controller-0")
        if old.returncode is None:
            os.killpg(old.pid, signal.SIGKILL)
        await old.wait()
        await old.close()

    async def start_controller(self, wait_s: float = 120.0) -> None:
        """Start the controller again on its address and wait until it is READY."""
        await self._spawn("controller-0", wait_s)

    async def stop(self) -> None:
        """Stop every started role, the controller last."""
        for role_id in reversed(ORDER):
            proc = self.procs.pop(role_id, None)
            if proc is not None:
                await proc.terminate(_STOP_GRACE_S)

    async def _spawn(self, role_id: str, wait_s: float) -> None:
        argv = [sys.executable, "-P", "-m", "dsi.cli.role", "--config", str(self.path), "--role", role_id]
        proc = self.procs[role_id] = await RoleProcess.spawn(role_id, argv)
        await proc.ready(wait_s)
