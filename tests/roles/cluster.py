"""A disaggregated cluster of real processes: one ``dsi-role`` per role, killable one by one.

``Cluster`` starts every role of a config (configs/local.toml on free ports by default), knows
each role's address and pid, and talks to the engines through the gateway's own router
(``DecodePool``) and ``GetEngineStats``. Leaving the ``Procs`` block kills everything.
"""

from __future__ import annotations

import asyncio
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq.asyncio

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.hit_policy import HitPolicy
from dsi.engine.params import SamplingParams
from dsi.messages import ALL
from dsi.messages.gateway import Generate
from dsi.messages.handoff import EngineStats, GetEngineStats
from dsi.model.prepare import ensure_model
from dsi.model.weights import load_model
from dsi.roles.entrypoint.backends import DecodePool
from dsi.transport.client import Peer
from tests.dsi.cli.procs import SHARED_MODEL_DIR, Proc, Procs, local_config, python_module


def cluster_config(
    tmp_path: Path,
    *,
    backend: str = "tcp",
    lease_timeout_s: float = 30.0,
    keep: tuple[str, ...] = (),
    hit_policy: str = "bounded",
) -> Path:
    path = local_config(tmp_path, keep=keep, interval_s=0.5)
    text = path.read_text()
    text = re.sub(r'(?m)^hit_policy = "[a-z]*"', f'hit_policy = "{hit_policy}"', text)
    text = re.sub(r'(?m)^backend = ".*"$', f'backend = "{backend}"', text)
    text = re.sub(r"(?m)^lease_timeout_s = .*$", f"lease_timeout_s = {lease_timeout_s}", text)
    text = re.sub(r"(?m)^heartbeat_timeout_s = .*$", "heartbeat_timeout_s = 3.0", text)
    path.write_text(text)
    return path


def role_addresses(config: Path) -> dict[str, str]:
    blocks = config.read_text().split("[[roles]]")[1:]
    out = {}
    for block in blocks:
        role_id = re.search(r'(?m)^id = "([^"]+)"', block).group(1)  # type: ignore[union-attr]
        out[role_id] = re.search(r'(?m)^bind = "([^"]+)"', block).group(1)  # type: ignore[union-attr]
    return out


@dataclass
class Cluster:
    config: Path
    procs: Procs
    running: dict[str, Proc] = field(default_factory=dict)

    @property
    def addresses(self) -> dict[str, str]:
        return role_addresses(self.config)

    def start(self, *role_ids: str) -> None:
        """Start roles (all of the config when none are named), each in its own process."""
        ids = role_ids or tuple(self.addresses)
        started = []
        for role_id in ids:
            argv = python_module("dsi.cli.role", "--config", str(self.config), "--role", role_id)
            self.running[role_id] = proc = self.procs.start(role_id, argv)
            started.append((role_id, proc))
        for role_id, proc in started:
            assert proc.wait_ready() == f"READY {role_id}"

    def kill(self, role_id: str, sig: signal.Signals = signal.SIGKILL) -> None:
        proc = self.running[role_id]
        proc.signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)

    def controller(self) -> str:
        return self.addresses["controller-0"]


class Client:
    """The gateway's router in the test process, plus direct peers for engine stats."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.ctx = zmq.asyncio.Context()
        self.pool = DecodePool(cluster.controller(), self.ctx, refresh_s=0.3, item_timeout_s=60.0)
        self._peers: dict[str, Peer] = {}

    async def __aenter__(self) -> Client:
        await self.pool.start()
        await self.wait_instances()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.pool.close()
        for peer in self._peers.values():
            await peer.close()
        self.ctx.destroy(linger=0)

    async def wait_instances(self, timeout: float = 30.0) -> None:
        ids = self.cluster.addresses
        want_d = {i for i in ids if i.startswith("decode") and i in self.cluster.running}
        want_p = {i for i in ids if i.startswith("prefill") and i in self.cluster.running}
        for _ in range(int(timeout / 0.1)):
            await self.pool.refresh()
            if want_d <= set(self.pool.decode.ready) and want_p <= set(self.pool.prefill.ready):
                return
            await asyncio.sleep(0.1)
        raise AssertionError(f"instances not ready: {self.pool.decode.ready} {self.pool.prefill.ready}")

    async def generate(
        self, request_id: str, prompt: list[int], max_tokens: int, hit_policy: HitPolicy | None = None
    ) -> list[int]:
        msg = Generate(
            request_id, prompt, SamplingParams(max_tokens=max_tokens, temperature=0.0), hit_policy=hit_policy
        )
        tokens: list[int] = []
        finish = ""
        async for chunk in self.pool.generate(msg):
            tokens += chunk.token_ids
            finish = chunk.finish or finish
        assert finish in ("length", "stop"), finish
        return tokens

    async def stats(self, role_id: str) -> EngineStats:
        peer = self._peers.get(role_id)
        if peer is None:
            peer = self._peers[role_id] = Peer(
                self.cluster.addresses[role_id], self.ctx, types=ALL, timeout=10
            )
            await peer.connect()
        return await peer.ask(GetEngineStats())


# Greedy outputs already computed in this test process: {prompts: (max_tokens, outputs)}. The
# engines are batch-invariant and greedy decoding is deterministic, so a request's output for
# max_tokens=n is the first n tokens of its output for any larger max_tokens.
_GREEDY_DONE: dict[tuple[tuple[int, ...], ...], tuple[int, list[list[int]]]] = {}


def reference_outputs(
    prompts: list[list[int]], max_tokens: int, sampling: SamplingParams | None = None
) -> list[list[int]]:
    """Outputs of one in-process engine (the semantics every deployment must reproduce): greedy,
    or ``sampling`` (its max_tokens replaced). Greedy outputs are computed once per test process
    (tests that compare against the same prompts share them)."""
    key = tuple(tuple(p) for p in prompts)
    if sampling is None and key in _GREEDY_DONE and _GREEDY_DONE[key][0] >= max_tokens:
        return [list(out[:max_tokens]) for out in _GREEDY_DONE[key][1]]
    cfg, w = load_model(ensure_model(SHARED_MODEL_DIR, "tiny"))
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False))
    params = (
        SamplingParams(max_tokens=max_tokens, temperature=0.0)
        if sampling is None
        else msgspec.structs.replace(sampling, max_tokens=max_tokens)
    )
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    engine.close()
    outputs = [done[str(i)] for i in range(len(prompts))]
    if sampling is None:
        _GREEDY_DONE[key] = (max_tokens, [list(out) for out in outputs])
    return outputs
