"""``dsi serve``: a whole cluster from one config file, one ``dsi-role`` process per role.

    dsi serve [--config configs/local.toml] [--port 8000] [--ready-timeout 60] [--log-format text|json]
              [--no-fork-server]

    controller  --READY-->  every other role at once  --READY-->  all registered at the controller
        --> the gateway's /health says it can serve (with an entrypoint and a decode role)
        --> banner + instance table --> keep every role running until SIGINT / SIGTERM

The processes run under a ``LocalProvisioner``: one that dies is replaced (same role id, new
pid, after a backoff) while the others keep serving; the replacement registers with the
controller by its heartbeats, and a replaced controller learns every instance again the same
way. One the controller declares dead (its heartbeats stopped) while its process still exists
(stopped, hung) is killed first, then replaced the same way (``DeadReaper``). An instance that keeps dying is given up (logged as an error); if that is the controller,
every role is stopped and serve exits 1.

With an [autoscale] section only ``min_instances`` + ``ready_pool`` instances of a scaled role start
(the first ones of the config); then a ``ScaleFollower`` starts and stops instances of it
every heartbeat interval for the controller's targets (``dsi status`` shows them).

A signal stops every child and exits 0: the entrypoints first, which drain (they answer /health
and new requests 503 while their requests in flight finish on the engines, still serving), then
the others in reverse start order (the controller last). Each child gets ``STOP_GRACE_S`` between
SIGTERM and SIGKILL, so an entrypoint is started with a drain of at most ``STOP_GRACE_S`` - 2 s
(``--drain-timeout``; less when its ``drain_timeout_s`` says so). A role whose first start fails,
or a cluster not ready within --ready-timeout seconds, stops all the others and exits 1.

Engine roles on dsi's own engine (prefill, decode) are forked from a fork server that imported
torch and the engine once (dsi.provision.forkserver), so a start or a replacement skips about
1.8 CPU seconds of imports; ``--no-fork-server`` starts them in fresh interpreters like the others.

``--log-format`` overrides ``[logging] format`` for serve and every role (the entrypoints' access
log included).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TextIO, TypeVar

import aiohttp
import zmq.asyncio

from dsi.cli.status import ControllerUnreachable, fetch_instances, format_table
from dsi.config import (
    ConfigError,
    EngineOptions,
    EntrypointOptions,
    NodeConfig,
    RoleConfig,
    load_config,
    with_http_port,
)
from dsi.config.autoscale import check_declared
from dsi.logs import setup_logging
from dsi.messages import ALL
from dsi.messages.control import InstanceInfo
from dsi.provision import LocalProvisioner, ProvisionedInstance, StartFailed
from dsi.provision.follow import ScaleFollower
from dsi.provision.forkserver import RoleForker, forkable
from dsi.provision.process import describe_exit, role_environment
from dsi.provision.python import NoVllm, role_python
from dsi.provision.reaper import DeadReaper
from dsi.roles.curve import client_keys
from dsi.transport.client import Peer

DEFAULT_CONFIG = "configs/local.toml"
STOP_GRACE_S = 10.0  # seconds between a child's SIGTERM and its SIGKILL
_DRAIN_MAX_S = STOP_GRACE_S - 2.0  # an entrypoint's drain, with time left to close and exit
_POLL_S = 0.2
T = TypeVar("T")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("serve", help="start every role of a config on this machine and supervise them")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"cluster config (default {DEFAULT_CONFIG})")
    parser.add_argument(
        "--port", type=int, default=None, help="HTTP port of the gateway (default: the config's)"
    )
    parser.add_argument(
        "--ready-timeout",
        type=float,
        default=None,
        help="seconds for the whole cluster to come up (default 60; with vLLM roles, their start_timeout_s + 60)",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="the log format of serve and every role (default: [logging] format)",
    )
    parser.add_argument(
        "--no-fork-server",
        action="store_true",
        help="start engine roles in fresh interpreters, not forked from the preloaded fork server",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
        if args.port is not None:
            cfg = with_http_port(cfg, args.port)
        _check_local(cfg)
        _check_autoscale(cfg)
        for role in cfg.roles:
            role_python(cfg, role.id)
    except (ConfigError, NoVllm) as exc:
        print(f"dsi serve: {exc}", file=sys.stderr)
        return 2
    log_format = args.log_format
    setup_logging(log_format or cfg.logging.format, cfg.logging.level, role="serve")
    try:
        _prepare_model(cfg)
    except ValueError as exc:
        print(f"dsi serve: {exc}", file=sys.stderr)
        return 1
    ready_timeout = args.ready_timeout if args.ready_timeout is not None else default_ready_timeout(cfg)
    return asyncio.run(_Serve(cfg, args.port, ready_timeout, log_format, not args.no_fork_server).run())


def default_ready_timeout(cfg: NodeConfig) -> float:
    """60 s, or with vLLM roles (which load and profile their model first) their longest
    ``start_timeout_s`` plus 60 s."""
    starts = [
        r.options.vllm.start_timeout_s
        for r in cfg.roles
        if isinstance(r.options, EngineOptions) and r.options.engine == "vllm"
    ]
    return max(starts, default=0.0) + 60.0


def _prepare_model(cfg: NodeConfig) -> None:
    """Import ``[model] gguf`` into ``[model] dir`` once, before any role starts, so that the
    import (tens of seconds) does not count against --ready-timeout."""
    model = cfg.model
    if model.gguf is None or (model.dir / "config.json").exists():
        return
    from dsi.model.prepare import ensure_model

    _say(f"importing {model.gguf} into {model.dir} (first start)")
    ensure_model(model.dir, model.config, model.gguf)


def role_command(
    config: str,
    role_id: str,
    http_port: int | None,
    python: str | None = None,
    *,
    drain_timeout_s: float | None = None,
    log_format: str | None = None,
) -> list[str]:
    """The dsi-role command line of one role, run by ``python`` (default: this interpreter).
    ``-P``: the working directory is not put on the role's ``sys.path`` (in a source checkout its
    folders would shadow installed packages, see dsi.folders); dsi comes from its installation."""
    argv = [python or sys.executable, "-P", "-m", "dsi.cli.role", "--config", config, "--role", role_id]
    if drain_timeout_s is not None:
        argv += ["--drain-timeout", f"{drain_timeout_s:g}"]
    if log_format is not None:
        argv += ["--log-format", log_format]
    return [*argv, "--http-port", str(http_port)] if http_port is not None else argv


def _check_local(cfg: NodeConfig) -> None:
    """ConfigError for a kubernetes [provisioner]: serve runs every role as a local process."""
    if cfg.provisioner.kind != "local":
        raise ConfigError(
            str(cfg.source),
            "provisioner.kind",
            f"{cfg.provisioner.kind!r}: dsi serve runs the roles as processes on this host; with "
            "kubernetes each pod runs dsi-role and the controller scales the StatefulSets",
        )


def _check_autoscale(cfg: NodeConfig) -> None:
    """ConfigError when an [autoscale] section cannot be followed here."""
    if cfg.autoscale is None:
        return
    if not cfg.roles_of("controller"):
        raise ConfigError(str(cfg.source), "autoscale", "needs a controller role in the same config")
    declared = {kind: len(cfg.roles_of(kind)) for kind in ("prefill", "decode")}
    check_declared(cfg.autoscale, declared, str(cfg.source))


def first_roles(cfg: NodeConfig) -> list[RoleConfig]:
    """The roles serve starts itself: all, but of a scaled kind only the first
    min_instances + ready_pool."""
    scaled = cfg.autoscale.scaled() if cfg.autoscale is not None else {}
    first: list[RoleConfig] = []
    for role in cfg.roles:
        bounds = scaled.get(role.kind)  # type: ignore[call-overload]
        if bounds is None or sum(1 for r in first if r.kind == role.kind) < bounds.initial:
            first.append(role)
    return first


class _Serve:
    def __init__(
        self,
        cfg: NodeConfig,
        http_port: int | None,
        ready_timeout_s: float,
        log_format: str | None = None,
        fork_roles: bool = True,
    ) -> None:
        self.cfg = cfg
        self.http_port = http_port
        self.ready_timeout_s = ready_timeout_s
        self.log_format = log_format
        self.provisioner = LocalProvisioner(
            self._command,
            grace_s=STOP_GRACE_S,
            ready_timeout_s=ready_timeout_s,
            on_change=self._changed,
            forker=RoleForker(self._forkable, role_environment(os.environ), label=str(cfg.source))
            if fork_roles
            else None,
        )
        self.stop_requested = asyncio.Event()
        self.controller_failed: ProvisionedInstance | None = None
        self._fatal = asyncio.Event()
        self.first = first_roles(cfg)
        self.follower: ScaleFollower | None = None
        self._follow_ctx: zmq.asyncio.Context | None = None

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop_requested.set)
        try:
            return await self._run()
        finally:
            if self.follower is not None:
                await self.follower.close()
            await self._stop_entrypoints()
            await self.provisioner.close()
            if self._follow_ctx is not None:
                self._follow_ctx.destroy(linger=0)

    async def _run(self) -> int:
        try:
            started = await self._until_stopped(self._start_all(), self.ready_timeout_s)
        except (StartFailed, TimeoutError) as exc:
            reason = str(exc) or f"the cluster was not ready in {self.ready_timeout_s:g}s"
            _say(f"{reason}; stopping every role")
            return 1
        if not started:
            return 0
        await self._until_stopped(self._keep_serving())
        failed = self.controller_failed
        if failed is None:
            return 0
        _say(
            f"{failed.role_id} was given up (it kept dying, last with {describe_exit(failed.last_exit)}); "
            "stopping every role"
        )
        return 1

    async def _keep_serving(self) -> None:
        """Until a fatal failure; meanwhile kill the instances the controller declares dead (so that
        they are replaced) and follow its scale targets, if any. A node config without the
        controller (one serve per host) reaps its own instances too: they report to the
        controller at ``cluster.controller`` all the same."""
        self._follow_ctx = zmq.asyncio.Context()
        peer = Peer(
            self.cfg.cluster.controller,
            self._follow_ctx,
            types=ALL,
            peer_id="dsi-serve",
            keys=client_keys(self.cfg.security),
            timeout=5.0,
        )
        every_s = self.cfg.cluster.heartbeat_interval_s
        tasks = [asyncio.ensure_future(DeadReaper(self.provisioner, peer, every_s).run())]
        if self.cfg.autoscale is not None:
            declared = {kind: [r.id for r in self.cfg.roles_of(kind)] for kind in self.cfg.autoscale.scaled()}
            self.follower = ScaleFollower(self.provisioner, declared, peer, every_s)
            tasks.append(asyncio.ensure_future(self.follower.run()))
        try:
            await self._fatal.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await peer.close()

    async def _stop_entrypoints(self) -> None:
        """Stop the entrypoints (all at once) before the roles their requests run on."""
        provisioned = {inst.role_id for inst in self.provisioner.list()}
        ids = [role.id for role in self.cfg.roles_of("entrypoint") if role.id in provisioned]
        await asyncio.gather(*(self.provisioner.stop(role_id) for role_id in ids))

    def _changed(self, inst: ProvisionedInstance) -> None:
        if inst.state == "failed" and self.cfg.role(inst.role_id).kind == "controller":
            self.controller_failed = inst
            self._fatal.set()

    async def _until_stopped(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T | None:
        """The result of `coro`, or None when a stop signal comes first; TimeoutError after `timeout`."""
        work = asyncio.ensure_future(asyncio.wait_for(coro, timeout))
        stop = asyncio.ensure_future(self.stop_requested.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, stop):
                task.cancel()
            await asyncio.gather(work, stop, return_exceptions=True)
        return None if work.cancelled() else work.result()

    async def _start_all(self) -> bool:
        controllers = [role for role in self.first if role.kind == "controller"]
        others = [role for role in self.first if role.kind != "controller"]
        for wave in (controllers, others):
            try:
                async with asyncio.TaskGroup() as group:  # one failure cancels the others' wait
                    for role in wave:
                        group.create_task(self.provisioner.start(role.id))
            except BaseExceptionGroup as failures:
                raise failures.exceptions[0] from None
        table = await self._registered() if controllers else []
        if controllers and any(role.kind == "decode" for role in self.first):
            await self._serving()
        _say(f"gateway {self._gateway()} ({len(self.first)} instances)", stream=sys.stdout)
        if table:
            print(format_table(table), flush=True)
        return True

    async def _registered(self) -> list[InstanceInfo]:
        """Wait until the controller lists every role started as serving (or, of a scaled kind,
        as serving or ready: the ready pool); the table."""
        wanted = {role.id for role in self.first}
        scaled = {
            role.id for role in self.first if self.cfg.autoscale and role.kind in self.cfg.autoscale.scaled()
        }
        keys = client_keys(self.cfg.security)
        while True:
            for inst in self.provisioner.list():
                if inst.state == "failed":
                    raise StartFailed(f"{inst.role_id} kept dying, last with {describe_exit(inst.last_exit)}")
            try:
                table = await fetch_instances(self.cfg.cluster.controller, keys, timeout=2.0)
            except ControllerUnreachable:
                continue
            ready = {
                info.instance_id
                for info in table.instances
                if info.state == "serving" or (info.state == "ready" and info.instance_id in scaled)
            }
            if wanted <= ready:
                return [info for info in table.instances if info.instance_id in wanted]
            await asyncio.sleep(_POLL_S)

    async def _serving(self) -> None:
        """Wait until the gateway has learnt enough instances from the controller to serve."""
        url = self._gateway()
        if not url.startswith("http"):
            return
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while True:
                try:
                    async with http.get(f"{url}/health") as resp:
                        if resp.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(_POLL_S)

    def _command(self, role_id: str) -> list[str]:
        options = self.cfg.role(role_id).options
        drain = min(options.drain_timeout_s, _DRAIN_MAX_S) if isinstance(options, EntrypointOptions) else None
        return role_command(
            os.path.abspath(self.cfg.source),
            role_id,
            self.http_port,
            role_python(self.cfg, role_id),
            drain_timeout_s=drain,
            log_format=self.log_format,
        )

    def _forkable(self, role_id: str, argv: Sequence[str]) -> list[str] | None:
        """The role's arguments when the fork server runs it (an engine role on dsi's engine)."""
        role = self.cfg.role(role_id)
        engine = role.options.engine if isinstance(role.options, EngineOptions) else None
        return forkable(argv, role.kind, engine)

    def _gateway(self) -> str:
        for role in self.cfg.roles:
            if isinstance(role.options, EntrypointOptions):
                return f"http://{role.options.http_host}:{role.options.http_port}"
        return "none (no entrypoint role)"


def _say(text: str, stream: TextIO | None = None) -> None:
    print(f"dsi serve: {text}", file=stream or sys.stderr, flush=True)
