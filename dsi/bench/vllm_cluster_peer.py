"""The peer side of ``dsi bench vllm-cluster``: plain ``vllm serve`` instances, behind
``vllm-router`` or alone, on the terms of dsi's vLLM roles.

Each instance is vLLM's OpenAI server (:class:`dsi.bench.peers_served_vllm.VllmServer`) started
from one dsi role's ``[roles.vllm]`` options (:class:`dsi.config.vllm.VllmOptions`): the same
interpreter (:func:`dsi.provision.python.vllm_python`), dtype, context, block size (dsi's page,
:data:`dsi.vllm.wiring.BLOCK_SIZE`), engine ``args`` as command-line flags, and the environment
dsi's role sets (:func:`dsi.vllm.service.apply_engine_environment`: KV cache GiB, OpenMP threads bound
to the role's ``cpu_threads``), with vLLM's prefix caching on (its default, as in dsi's roles).
What dsi adds (its connector, the kvstore) is what the comparison measures.

Prompt tokens computed come from each server's Prometheus ``/metrics``: vLLM's
``vllm:prompt_tokens_by_source_total{source="local_compute"}``, the counter dsi's
``EngineStats.computed_prompt_tokens`` reads on its side (vLLM's ``PromptTokenStats.computed``);
``vllm:prompt_tokens_total`` minus ``vllm:prefix_cache_hits_total`` (tokens) is kept beside it
as a check (:func:`counters_of`).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from dsi.bench.peers_served_client import wait_ready
from dsi.bench.peers_served_vllm import VllmServer, server_argv
from dsi.bench.vllm_cluster_summary import PromptCounters
from dsi.config.vllm import VllmOptions
from dsi.transport.ports import free_port

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def engine_flags(args: Mapping[str, Any]) -> list[str]:
    """``[roles.vllm] args`` as ``vllm serve`` flags: ``max_num_seqs = 32`` -> ``--max-num-seqs 32``,
    ``true`` -> the flag alone, ``false`` -> ``--no-<flag>``, an array -> its values after the flag."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False:
            out.append("--no-" + key.replace("_", "-"))
        elif isinstance(value, (list, tuple)):
            out += [flag, *(str(v) for v in value)]
        else:
            out += [flag, str(value)]
    return out


def peer_argv(
    python: Path, model: Path, name: str, port: int, options: VllmOptions, block_size: int
) -> list[str]:
    """The command line of one instance on the terms of a dsi role with ``options``."""
    args = dict(options.args)
    max_seqs = int(args.pop("max_num_seqs", 256))  # vLLM's own default when the role sets none
    args.pop("enforce_eager", None)  # server_argv always runs eager
    return server_argv(
        python,
        model,
        name,
        port,
        max_seqs,
        max_model_len=options.max_model_len,
        dtype=options.dtype,
        prefix_caching=True,
        block_size=block_size,
        extra=engine_flags(args),
    )


def peer_env(options: VllmOptions, allowed_cpus: set[int]) -> dict[str, str]:
    """This process's environment plus what dsi's vLLM role sets for ``options``."""
    from dsi.vllm.service import apply_engine_environment

    env = dict(os.environ)
    apply_engine_environment(env, options, allowed_cpus)
    return env


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text -> (name, labels, value) per sample; comments and bad lines are skipped."""
    out = []
    for line in text.splitlines():
        found = _SAMPLE.match(line.strip())
        if found is None or line.startswith("#"):
            continue
        try:
            value = float(found.group(3))
        except ValueError:
            continue
        out.append((found.group(1), dict(_LABEL.findall(found.group(2) or "")), value))
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of metric ``name`` over its samples whose labels include ``labels``."""
    return sum(
        value
        for sample, have, value in metric_samples(text)
        if sample == name and all(have.get(k) == v for k, v in labels.items())
    )


def counters_of(metrics_text: str) -> PromptCounters:
    """One server's prompt tokens since start, from its ``/metrics``: computed (vLLM's
    ``local_compute`` source), local prefix-cache hits, loaded by a connector (none here) and
    ``vllm:prompt_tokens_total``."""
    return PromptCounters(
        computed=int(metric_sum(metrics_text, "vllm:prompt_tokens_by_source_total", source="local_compute")),
        local_hits=int(metric_sum(metrics_text, "vllm:prefix_cache_hits_total")),
        loaded=int(metric_sum(metrics_text, "vllm:external_prefix_cache_hits_total")),
        total=int(metric_sum(metrics_text, "vllm:prompt_tokens_total")),
    )


class PeerInstances:
    """One vLLM server per entry of ``options`` (each a dsi role's, ``cpu_threads`` included),
    logs in ``log_dir``. ``start``, then ``stop`` in a finally."""

    def __init__(
        self, python: Path, model: Path, name: str, options: list[VllmOptions], log_dir: Path
    ) -> None:
        from dsi.vllm.wiring import BLOCK_SIZE

        self.ports = [free_port() for _ in options]
        self.servers = []
        for i, (mine, port) in enumerate(zip(options, self.ports, strict=True)):
            argv = peer_argv(python, model, name, port, mine, BLOCK_SIZE)
            env = peer_env(mine, os.sched_getaffinity(0))
            self.servers.append(VllmServer(argv, log_dir / f"vllm-serve-{i}.log", env=env, cwd=log_dir))

    @property
    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    @property
    def url(self) -> str:
        return self.urls[0]

    @property
    def warm_urls(self) -> list[str]:
        return self.urls

    @property
    def bindings(self) -> list[str]:
        """The VLLM_CPU_OMP_THREADS_BIND of each instance."""
        return [s.env.get("VLLM_CPU_OMP_THREADS_BIND", "unset") for s in self.servers]

    def start(self, timeout_s: float) -> None:
        """Start every server and wait until all answer; RuntimeError naming the log otherwise."""
        for server in self.servers:
            server.start()
        for server, url in zip(self.servers, self.urls, strict=True):
            if not asyncio.run(wait_ready(url, timeout_s, server.alive)):
                state = "exited" if not server.alive() else f"not ready after {timeout_s:.0f} s"
                raise RuntimeError(f"vllm serve {state}; see {server.log_path}: {server.log_tail()}")

    async def counters(self) -> list[PromptCounters]:
        """Each server's prompt counters."""
        out = []
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            for url in self.urls:
                async with session.get(f"{url}/metrics") as resp:
                    out.append(counters_of(await resp.text()))
        return out

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


class RoutedPeers:
    """``instances`` behind vllm-router (from ``bin_dir``) in its default policy; its log in ``log_dir``."""

    def __init__(self, instances: PeerInstances, bin_dir: Path, log_dir: Path) -> None:
        self.instances = instances
        self.bin_dir = bin_dir
        self.log_dir = log_dir
        self.proc: subprocess.Popen | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warm_urls(self) -> list[str]:
        return [*self.instances.urls, self.url]

    def start(self, timeout_s: float) -> None:
        from dsi.bench.route_peers import start_router

        self.instances.start(timeout_s)
        self.proc, self.port = start_router(
            "vllm_router", self.bin_dir, self.instances.ports, self.log_dir, None
        )
        proc = self.proc
        if not asyncio.run(wait_ready(self.url, 120.0, lambda: proc.poll() is None)):
            raise RuntimeError(f"vllm-router did not answer; see {self.log_dir / 'vllm_router.log'}")

    async def counters(self) -> list[PromptCounters]:
        return await self.instances.counters()

    def stop(self) -> None:
        from dsi.bench.route_peers import stop_router

        try:
            if self.proc is not None:
                stop_router(self.proc)
        finally:
            self.instances.stop()


def router_policy(bin_dir: Path) -> str:
    """vllm-router's default policy, from its ``--help`` ("unknown" when the text does not say)."""
    from dsi.bench.route_peers import default_policy

    try:
        text = subprocess.run(
            [str(bin_dir / "vllm-router"), "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return default_policy(text) or "unknown"
