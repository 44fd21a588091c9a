"""The routers ``dsi bench route`` measures beside the gateway, from a venv of their own.

``install_peers`` puts pinned vllm-router and sglang-router wheels into ``<peers_dir>/venv``
(once; the project's own dependencies never include them; ``names`` picks some of them). ``start_router`` runs one in front
of the echo backends with ``--policy round_robin`` on 127.0.0.1, its output in
``<peers_dir>/<name>.log``; ``policy=None`` leaves the router's own default policy
(:func:`default_policy` reads it from its ``--help``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from dsi.transport.ports import free_port

PEERS = {"vllm_router": "vllm-router==0.1.17", "sglang_router": "sglang-router==0.3.2"}
_HOST = "127.0.0.1"


def install_peers(peers_dir: Path, names: tuple[str, ...] = tuple(PEERS)) -> tuple[Path | None, str]:
    """The venv's bin directory with the routers ``names`` (keys of PEERS) installed, or None and why not."""
    venv = peers_dir / "venv"
    bin_dir = venv / "bin"
    pins = [PEERS[name] for name in names]
    if all((bin_dir / name.replace("_", "-")).exists() for name in names):
        return bin_dir, ""
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run(
            [str(bin_dir / "pip"), "install", "-q", *pins],
            check=True,
            capture_output=True,
            timeout=900,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        tail = getattr(exc, "stderr", b"") or b""
        return None, f"cannot install {' '.join(pins)} into {venv}: {exc} {tail.decode()[-300:]}".strip()
    return bin_dir, ""


def default_policy(help_text: str) -> str | None:
    """The policy a router runs without ``--policy``, as its ``--help`` text states it."""
    found = re.search(r"--policy \{[^}]*\}\s+(.*?)\(default:\s*(\w+)\)", help_text, re.S)
    return found.group(2) if found else None


def router_argv(
    name: str, bin_dir: Path, port: int, backends: list[int], policy: str | None = "round_robin"
) -> list[str]:
    """The command line of router ``name`` on ``port`` in front of the 127.0.0.1 ``backends`` ports
    (``policy`` None: the router's default)."""
    urls = [f"http://{_HOST}:{p}" for p in backends]
    common = [
        "--host",
        _HOST,
        "--port",
        str(port),
        "--worker-urls",
        *urls,
        *(["--policy", policy] if policy is not None else []),
        "--prometheus-port",
        str(free_port()),
        "--prometheus-host",
        _HOST,
    ]
    if name == "vllm_router":
        return [str(bin_dir / "vllm-router"), *common, "--log-level", "error"]
    return [str(bin_dir / "python"), "-m", "sglang_router.launch_router", *common, "--log-level", "error"]


def start_router(
    name: str, bin_dir: Path, backends: list[int], log_dir: Path, policy: str | None = "round_robin"
) -> tuple[subprocess.Popen, int]:
    """The router's process and the port it will listen on (ready once a request streams through)."""
    port = free_port()
    log = open(log_dir / f"{name}.log", "wb")  # noqa: SIM115 - the child writes it until stopped
    proc = subprocess.Popen(
        router_argv(name, bin_dir, port, backends, policy),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    return proc, port


def stop_router(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
