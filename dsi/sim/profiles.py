"""Hardware profiles: what one prefill or decode instance computes per second, and its sizes.

Every figure below is an assumption, stated with where it comes from; the simulator's results
mean nothing outside them.

``h800`` and ``h200``: one instance is one node of 8 GPUs serving the ``flash`` shape
(``dsi.model.config.FLASH``: ~14.4 GFLOP per prefilled token with decoder-side bounded replay,
~30 GFLOP per decoded token, 371.5 GB of weights at 1 byte per parameter, 112,128 bytes per
128-token page, 5.49 MB of SWA state per request).

    figure                        h800                          h200
    FP8 dense peak                8 x 1,979 TFLOP/s             the same (H100/H200 compute)
    HBM bandwidth                 8 x 3.35 TB/s = 26.8 TB/s     8 x 4.8 TB/s = 38.4 TB/s
    HBM                           8 x 80 GB                     8 x 141 GB
    prefill, effective            35 % of peak = 5.54 PFLOP/s   the same
    decode FLOPs, effective       20 % of peak = 3.17 PFLOP/s   the same
    decode bandwidth, effective   70 % = 18.8 TB/s              70 % = 26.9 TB/s
    decode fixed step             weights / bandwidth + 3 ms    (all-to-all, launches)
    decode batch (max requests)   512                           512
    decode KV capacity            200 M tokens                  700 M tokens
    store reads (3FS)             40 GB/s per node              the same
    PD handoff (400 Gb/s RDMA)    50 GB/s                       the same
    instance start                300 s                         the same
    prefill fixed                 10 ms per prompt              the same

35 % of the FP8 peak is what DeepSeek's published V3 prefill rate implies: 73.7K input
tokens/s per H800 node at ~74 GFLOP per token (37 B active parameters) is 5.45 PFLOP/s. The
decode fixed step assumes every expert is read once per step (large batches touch them all).

``cpu``: one instance is one process serving the ``tiny`` shape on this machine's CPU, from the
figures ``dsi bench engine --json`` prints (:func:`cpu_profile`): prefill FLOP/s =
``prefill_tok_s`` x the tiny model's FLOPs per token of a 1,024-token prompt (the bench's
prompts), so the FLOP model carries it to other lengths; the decode step is a least-squares
line through the (batch, seconds per step) points ``batch / decode_tok_s_b{1,16,64}`` of the
default scheduling mode, with no KV-length term (the bench decodes 32-token prompts). Its
``prefill_fixed_s`` is 0: the path around the forward (gateway, balancer, decode reservation,
data plane) is not in the bench's figures; ``dsi sim validate`` measures it on a served cluster
and adds it to each request's TTFT as a path outside the instances
(:func:`dsi.sim.validate.request_path`, ``SimConfig.path_s``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dsi.model.config import FLASH, TINY, ModelConfig
from dsi.model.flops import prefill_flops
from dsi.sim.step_time import StepTimeModel

FP8_PEAK_FLOPS = 1_979e12  # per GPU, dense (H800 / H100 / H200 SXM)
GPUS = 8
PREFILL_MFU = 0.35
DECODE_MFU = 0.20
BANDWIDTH_EFFICIENCY = 0.70
STEP_OVERHEAD_S = 0.003
# `dsi bench engine --json` on this project's 2-core machine, otherwise idle (tiny model,
# 2026-12-05): the figures the cpu profile uses when no file is given.
CPU_BENCH = {
    "default_scheduling": "sync",
    "prefill_tok_s": 7748.1,
    "decode_tok_s_b1_sync": 16.9,
    "decode_tok_s_b16_sync": 281.2,
    "decode_tok_s_b64_sync": 408.2,
}


@dataclass(slots=True, frozen=True, kw_only=True)
class HardwareProfile:
    """One instance's speeds and sizes. Seconds, bytes, FLOPs, tokens."""

    name: str
    model: ModelConfig
    prefill_flops_per_s: float  # effective FLOP/s of one prefill instance
    prefill_fixed_s: float  # added to every prefill (scheduling, launches, the first token)
    decode: StepTimeModel  # one decode instance's step time
    decode_max_requests: int  # requests one decode instance batches
    decode_kv_tokens: int  # KV tokens one decode instance holds
    store_bytes_per_s: float  # hit pages read from the store into one prefill
    transfer_bytes_per_s: float  # PD handoff: pages and state over the data plane
    start_s: float  # from starting an instance until it is ready

    def __post_init__(self) -> None:
        positive = ("prefill_flops_per_s", "store_bytes_per_s", "transfer_bytes_per_s")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if self.decode_max_requests < 1 or self.decode_kv_tokens < 1:
            bad.append("decode_max_requests / decode_kv_tokens")
        if self.prefill_fixed_s < 0 or self.start_s < 0:
            bad.append("prefill_fixed_s / start_s")
        if bad:
            raise ValueError(f"hardware profile {self.name!r}: bad {', '.join(bad)}")


def weight_bytes(cfg: ModelConfig, bytes_per_param: float = 1.0) -> float:
    """Parameters of every main layer (attention projections, router, routed and shared experts)
    plus embedding and logits, times ``bytes_per_param``."""
    h = cfg.hidden
    attention = h * (2 * cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim
    moe = h * cfg.n_experts + 3 * h * (cfg.n_experts * cfg.expert_dim + cfg.shared_dim)
    return (cfg.n_layers * (attention + moe) + 2 * cfg.vocab_size * h) * bytes_per_param


def gpu_node(name: str, hbm_tb_s: float, kv_tokens: int) -> HardwareProfile:
    """A node of 8 GPUs with ``hbm_tb_s`` TB/s each, serving ``flash`` (the module's table)."""
    bandwidth = GPUS * hbm_tb_s * 1e12 * BANDWIDTH_EFFICIENCY
    fixed = weight_bytes(FLASH) / bandwidth + STEP_OVERHEAD_S
    return HardwareProfile(
        name=name,
        model=FLASH,
        prefill_flops_per_s=GPUS * FP8_PEAK_FLOPS * PREFILL_MFU,
        prefill_fixed_s=0.010,
        decode=StepTimeModel.of_shape(FLASH, GPUS * FP8_PEAK_FLOPS * DECODE_MFU, bandwidth, fixed),
        decode_max_requests=512,
        decode_kv_tokens=kv_tokens,
        store_bytes_per_s=40e9,
        transfer_bytes_per_s=50e9,
        start_s=300.0,
    )


def cpu_profile(bench: Mapping[str, object]) -> HardwareProfile:
    """The ``cpu`` profile from the object ``dsi bench engine --json`` prints."""
    try:
        mode = str(bench.get("default_scheduling", "sync"))
        prefill_tok_s = float(bench["prefill_tok_s"])  # type: ignore[arg-type]
        points = [(b, b / float(bench[f"decode_tok_s_b{b}_{mode}"])) for b in (1, 16, 64)]  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not the output of `dsi bench engine --json`: {exc}") from None
    slope, intercept = _line(points)
    per_token = prefill_flops(TINY, 1024, TINY.keep).total / 1024
    return HardwareProfile(
        name="cpu",
        model=TINY,
        prefill_flops_per_s=prefill_tok_s * per_token,
        prefill_fixed_s=0.0,
        decode=StepTimeModel(max(intercept, 0.0), max(slope, 1e-9), 0.0),
        decode_max_requests=64,
        decode_kv_tokens=64 * TINY.max_context,
        store_bytes_per_s=1e9,  # a local directory
        transfer_bytes_per_s=2e9,  # shared memory or TCP on one host
        start_s=5.0,
    )


def _line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through ``points``."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    return slope, my - slope * mx


def get_profile(name: str, bench_json: Path | None = None) -> HardwareProfile:
    """``h800``, ``h200`` or ``cpu`` (from ``bench_json`` when given, else :data:`CPU_BENCH`)."""
    if bench_json is not None and name != "cpu":
        raise ValueError("a `dsi bench engine --json` file only calibrates the cpu profile")
    if name == "h800":
        return gpu_node("h800", 3.35, 200_000_000)
    if name == "h200":
        return gpu_node("h200", 4.8, 700_000_000)
    if name == "cpu":
        return cpu_profile(json.loads(bench_json.read_text()) if bench_json is not None else CPU_BENCH)
    raise ValueError(f"unknown hardware profile {name!r}; choose from {', '.join(PROFILES)}")


PROFILES = ("h800", "h200", "cpu")
