"""The dsi side of ``dsi bench vllm-cluster``: ``dsi serve`` of a derived config, and its vLLM
roles' prompt-token counters.

``dsi serve`` runs as in :class:`dsi.bench.soak_cluster.ServedCluster` (a session of its own,
ready at its ``dsi serve: gateway`` line, SIGINT then SIGKILL of its group). Prompt tokens
computed are the sum over the vLLM roles of ``EngineStats.computed_prompt_tokens`` (vLLM's
``PromptTokenStats.computed``), asked with ``GetEngineStats`` as the cluster tests ask it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import zmq.asyncio

from dsi.bench.soak_cluster import ServedCluster
from dsi.bench.vllm_cluster_config import Layout, vllm_roles, write_config
from dsi.bench.vllm_cluster_summary import PromptCounters
from dsi.config.vllm import VllmOptions
from dsi.messages import ALL
from dsi.messages.handoff import EngineStats, GetEngineStats
from dsi.roles.curve import client_keys
from dsi.transport.client import Peer
from dsi.vllm.wiring import staging_dir


class DsiSide:
    """``dsi serve`` with ``layout``'s vLLM instances, its files in ``side_dir`` (each instance's KV
    cache ``kv_cache_bytes`` where given, see :func:`dsi.bench.vllm_cluster_config.with_layout`)."""

    def __init__(
        self, layout: Layout, model_dir: Path, side_dir: Path, kv_cache_bytes: int | None = None
    ) -> None:
        shutil.rmtree(side_dir, ignore_errors=True)
        side_dir.mkdir(parents=True)
        self.layout = layout
        self.config = write_config(layout, model_dir, side_dir, kv_cache_bytes=kv_cache_bytes)
        self.cluster = ServedCluster(self.config, side_dir)
        self.roles: dict[str, VllmOptions] = vllm_roles(self.cluster.cfg)
        self.binds = {r.id: r.bind for r in self.cluster.cfg.roles if r.id in self.roles}

    @property
    def url(self) -> str:
        """The gateway."""
        return self.cluster.gateway

    @property
    def warm_urls(self) -> list[str]:
        """One warm-up request per vLLM instance, all at once through the gateway."""
        return [self.url] * len(self.roles)

    @property
    def model(self) -> str:
        return self.cluster.cfg.model.name

    def start(self, timeout_s: float) -> None:
        """Start serve; RuntimeError with the tail of its log when it exits before it is up."""
        try:
            self.cluster.start(ready_timeout_s=timeout_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {log_tail(self.cluster.log_path)}") from None

    async def counters(self) -> list[PromptCounters]:
        """Each vLLM role's prompt tokens since start: computed, local prefix-cache hits, loaded
        through dsi's connector (store hits, or a handoff's KV); ``total`` is their sum."""
        return [
            PromptCounters(
                computed=s.computed_prompt_tokens,
                local_hits=s.local_hit_tokens,
                loaded=s.cached_tokens,
                total=s.computed_prompt_tokens + s.local_hit_tokens + s.cached_tokens,
            )
            for s in await self._stats()
        ]

    async def _stats(self) -> list[EngineStats]:
        ctx = zmq.asyncio.Context()
        keys = client_keys(self.cluster.cfg.security)
        try:
            out = []
            for bind in self.binds.values():
                peer = Peer(bind, ctx, types=ALL, peer_id="bench", role="bench", keys=keys, timeout=30)
                await peer.connect(timeout=30)
                try:
                    out.append(await peer.ask(GetEngineStats(), timeout=60))
                finally:
                    await peer.close()
            return out
        finally:
            ctx.destroy(linger=0)

    def stop(self) -> None:
        """Stop serve (every role with it), then remove the roles' staging directories."""
        try:
            self.cluster.stop()
        finally:
            for role_id, bind in self.binds.items():
                shutil.rmtree(staging_dir(role_id, bind), ignore_errors=True)


def log_tail(path: Path, lines: int = 6) -> str:
    """The last ``lines`` lines of a log, joined by " | " ("" when it cannot be read)."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
