"""vLLM's OpenAI-compatible server for ``dsi bench peers-served``, from the peers venv.

``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1, the dequantised SmolLM2 directory
of :mod:`dsi.bench.peers_local`, fp32, eager (no torch.compile), prefix caching off, at most
``max_seqs`` sequences at once; environment as :func:`dsi.bench.peers_vllm.child_env` (offline,
1 GiB of KV cache, OpenMP threads bound to cores 0 .. threads - 1). It runs in a session of its
own, its output in ``<peers_dir>/peers-served-vllm.log``; :meth:`VllmServer.stop` stops it by
PID (SIGINT, then SIGKILL to its process group).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from dsi.bench.peers_vllm import child_env


def server_argv(python: Path, model: Path, name: str, port: int, max_seqs: int) -> list[str]:
    """The server's command line."""
    return [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "1024",
        "--max-num-seqs",
        str(max_seqs),
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--seed",
        "0",
    ]


class VllmServer:
    """One vLLM OpenAI server process."""

    def __init__(self, argv: list[str], log_path: Path, threads: int) -> None:
        self.argv = argv
        self.log_path = log_path
        self.threads = threads
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=child_env(self.threads),
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGINT the server, SIGKILL its process group (its engine core and workers) after
        `timeout_s` or once it has exited."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
