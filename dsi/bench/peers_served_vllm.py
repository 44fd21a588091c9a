"""vLLM's OpenAI-compatible server for ``dsi bench peers-served``, from the peers venv.

``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1, the dequantised SmolLM2 directory
of :mod:`dsi.bench.peers_local`, fp32, eager (no torch.compile) or vLLM's default compiled mode
(``eager=False``), prefix caching off, at most ``max_seqs`` sequences at once; environment as
:func:`dsi.bench.peers_vllm.child_env` (offline, 1 GiB of KV cache, one OpenMP thread bound to each
of the given cores). With ``preexec`` (:func:`dsi.bench.pinning.pinned`) the server and every
process it starts run on those cores only. It runs in a session of its own, its output in
``<peers_dir>/peers-served-vllm.log``; :meth:`VllmServer.stop` stops it by PID (SIGINT, then
SIGKILL to its process group).

``dsi bench vllm-cluster`` runs the same server with its own settings (the keyword arguments of
:func:`server_argv`: context, dtype, block size, prefix caching on, engine flags) and environment
(``env``), from a working directory of its own (``cwd``: ``-m`` puts it on ``sys.path``, and dsi's
source root there would shadow packages vLLM imports).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from dsi.bench.peers_vllm import child_env


def server_argv(
    python: Path,
    model: Path,
    name: str,
    port: int,
    max_seqs: int,
    *,
    max_model_len: int = 1024,
    dtype: str = "float32",
    prefix_caching: bool = False,
    block_size: int | None = None,
    extra: Sequence[str] = (),
    eager: bool = True,
) -> list[str]:
    """The server's command line: greedy defaults of the engine only (``--generation-config
    vllm``: a model directory's generation_config.json does not change sampling), seed 0, eager
    or (``eager=False``) vLLM's default torch.compile mode, and ``extra`` flags last."""
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
        dtype,
        "--max-model-len",
        str(max_model_len),
        "--max-num-seqs",
        str(max_seqs),
        *(["--enforce-eager"] if eager else []),
        "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
        *(["--block-size", str(block_size)] if block_size is not None else []),
        "--generation-config",
        "vllm",
        "--seed",
        "0",
        *extra,
    ]


class VllmServer:
    """One vLLM OpenAI server process."""

    def __init__(
        self,
        argv: list[str],
        log_path: Path,
        threads: int = 1,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.argv = argv
        self.log_path = log_path
        self.threads = threads
        self.env = dict(env) if env is not None else child_env(threads)
        self.cwd = cwd
        self.preexec = preexec
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=self.preexec,
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
