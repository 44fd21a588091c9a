"""``dsi bench eplb``: rank load balance of expert parallelism before and after EPLB, and the
pause of one live rebalance.

    dsi bench eplb [--experts 64] [--top-k 6] [--ranks 8] [--redundant 1] [--layers 4]
                   [--tokens 4096] [--steps 16] [--skew 1.0] [--pause-ranks 4]
                   [--dp-ranks 2] [--dp-seqs 64] [--json]

Trace: per layer, a Zipf popularity over the experts (weight 1 / rank**skew, shuffled per layer);
each step routes ``--tokens`` tokens to ``--top-k`` distinct experts drawn from it (Gumbel top-k).
The placement is computed from the first ``--steps`` steps (the window) and measured on the next
``--steps`` (held out), with each step's pairs routed among replicas by load (``pick_slots``).

    before   experts split evenly over the ranks in order, no replicas (E / ranks per rank)
    after    dsi.eplb.rebalance (global policy), ``--redundant`` extra slots per rank

Imbalance is max / mean rank load: ``imbalance_*`` over the held-out window's total per layer
(what the placement controls), ``*_step`` the mean over steps (includes the sampling noise of
one step's tokens), both averaged over layers.

Pause: a live tiny-model EP group of ``--pause-ranks`` gloo processes rebalances ``--runs``
times between two skewed loads (so expert weights really move); ``pause_ms`` is the median time
of one rebalance (gather counts, placement, weight moves, switch), ``step_ms`` the median
forward of a 64-token prefill step through the same group, side by side.

Data-parallel attention: ``--dp-seqs`` sequences of the tiny model, a prefill step of all their
32-token prompts, then decode steps of all of them (one token each), ``--runs`` times each;
``dp_{decode,prefill}_ms_<runner>`` are the medians, ``dp_<phase>_dp_vs_<runner>`` the ratios,
``dp_<phase>_rank0_cpu_ms_<runner>`` the CPU time of the engine's process (rank 0) per step:

    ep1               one process (the engine's runner, no group), all of torch's threads
    ep1_rank_threads  the same with one rank's threads (cpu_count / ranks)
    dp                a group of ``--dp-ranks`` ranks, each computing its share of the
                      sequences' dense layers and attention (``dp_rank_token_share``)
    rank0             the same group with every sequence's attention on rank 0 (the workers only
                      hold experts): what data-parallel attention replaces

The ranks share this host's cores (each takes cpu_count / ranks torch threads).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from dsi.eplb import Placement, imbalance, pick_slots, rebalance, resize
from dsi.eplb.group import EpOptions, ExpertGroup, threads_per_rank


def skewed_trace(
    layers: int, experts: int, top_k: int, tokens: int, steps: int, skew: float, seed: int
) -> list[list[torch.Tensor]]:
    """Per step, per layer: [tokens * top_k] int64 logical experts of the token-expert pairs."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.arange(1, experts + 1, dtype=torch.float64).pow(-skew)
    logp = [base[torch.randperm(experts, generator=gen)].log().float() for _ in range(layers)]
    out = []
    for _ in range(steps):
        row = []
        for lp in logp:
            u = torch.rand(tokens, experts, generator=gen).clamp_min(1e-20)
            row.append((lp - (-u.log()).log()).topk(top_k, dim=-1).indices.reshape(-1))
        out.append(row)
    return out


def rank_loads(trace: list[list[torch.Tensor]], placement: Placement) -> torch.Tensor:
    """[steps, L, ranks] pairs each rank computes, routed among replicas by load."""
    per = placement.slots_per_rank
    return torch.stack(
        [
            torch.stack(
                [
                    torch.bincount(pick_slots(pairs, placement, i) // per, minlength=placement.num_ranks)
                    for i, pairs in enumerate(step)
                ]
            )
            for step in trace
        ]
    ).double()


def balance(args: argparse.Namespace) -> dict:
    trace = skewed_trace(
        args.layers, args.experts, args.top_k, args.tokens, 2 * args.steps, args.skew, args.seed
    )
    window, held_out = trace[: args.steps], trace[args.steps :]
    counts = torch.zeros(args.layers, args.experts, dtype=torch.int64)
    for step in window:
        for i, pairs in enumerate(step):
            counts[i] += torch.bincount(pairs, minlength=args.experts)
    if args.experts % args.ranks:
        raise SystemExit(
            "--experts must be a multiple of --ranks (the 'before' placement splits them evenly)"
        )
    even = Placement(torch.arange(args.experts).repeat(args.layers, 1), args.ranks, args.experts)
    t0 = time.perf_counter()
    placed = rebalance(counts, args.ranks, args.experts // args.ranks + args.redundant, "global")
    policy_ms = (time.perf_counter() - t0) * 1e3
    before, after = rank_loads(held_out, even), rank_loads(held_out, placed)
    figures = {
        "imbalance_before": imbalance(before.sum(0)),
        "imbalance_after": imbalance(after.sum(0)),
        "imbalance_after_window": imbalance(placed.rank_load(counts)),
        "imbalance_before_step": statistics.fmean(imbalance(s) for s in before),
        "imbalance_after_step": statistics.fmean(imbalance(s) for s in after),
        "policy_ms": policy_ms,
    }
    figures["before_vs_after"] = figures["imbalance_before"] / figures["imbalance_after"]
    return figures


def pause(args: argparse.Namespace) -> dict:
    """Rebalances and prefill steps of a live tiny-model EP group."""
    from dsi.engine.batch import StepSlice
    from dsi.model.config import TINY
    from dsi.model.weights import init_weights

    cfg, w = TINY, init_weights(TINY)
    ep = resize(args.pause_ranks, args.pause_ranks, cfg.n_experts, args.redundant)
    group = ExpertGroup.start(cfg, w, EpOptions(ep))
    try:
        hot = torch.ones(cfg.n_layers, cfg.n_experts)
        loads = [hot.clone(), hot.clone()]
        loads[0][:, 0], loads[1][:, -1] = 50.0, 50.0  # the hot expert moves from run to run
        pauses = [group.rebalance(loads[r % 2]) * 1e3 for r in range(args.runs)]
        runner = group.runner(cfg, w, num_blocks=4, num_slots=1)
        slot, table = runner.slots.allocate(), runner.pool.allocate(1)
        prompt = list(range(1000, 1064))
        steps = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            runner.forward([StepSlice(slot, table, 0, prompt, 0, True)])
            steps.append((time.perf_counter() - t0) * 1e3)
    finally:
        group.close()
    return {
        "pause_ms": statistics.median(pauses),
        "pause_ms_runs": pauses,
        "step_ms": statistics.median(steps),
        "pause_vs_step": statistics.median(pauses) / statistics.median(steps),
        "pause_ranks": ep.size,
    }


def step_times(runner, seqs: int, runs: int, prompt: int = 32) -> tuple[float, float, float, float]:
    """Median milliseconds of a prefill step of ``seqs`` prompts of ``prompt`` tokens (``runs``
    times, recomputing the same positions) and of a decode step of all of them together (one
    token each; ``runs`` steps after the prefill): (prefill, decode) wall time, then the same in
    CPU time of this process (rank 0: the engine's process)."""
    from dsi.engine.batch import StepSlice

    gen = torch.Generator().manual_seed(1)
    live = []
    for _ in range(seqs):
        table = runner.pool.allocate(-(-(prompt + runs + 1) // runner.cfg.block_size))
        live.append(
            (runner.slots.allocate(), table, torch.randint(100, 100_000, (prompt,), generator=gen).tolist())
        )
    prefill, decode, prefill_cpu, decode_cpu = [], [], [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), time.process_time()
        logits = runner.forward([StepSlice(slot, table, 0, t[:prompt], 0, True) for slot, table, t in live])
        prefill.append((time.perf_counter() - t0) * 1e3)
        prefill_cpu.append((time.process_time() - c0) * 1e3)
    for (_, _, t), row in zip(live, logits, strict=True):
        t.append(int(row.argmax()))
    for _ in range(runs):
        batch = [StepSlice(slot, table, len(t) - 1, [t[-1]], 0, True) for slot, table, t in live]
        t0, c0 = time.perf_counter(), time.process_time()
        logits = runner.forward(batch)
        decode.append((time.perf_counter() - t0) * 1e3)
        decode_cpu.append((time.process_time() - c0) * 1e3)
        for (_, _, t), row in zip(live, logits, strict=True):
            t.append(int(row.argmax()))
    for slot, table, _ in live:
        runner.slots.free(slot)
        runner.pool.free(table)
    return tuple(statistics.median(v) for v in (prefill, decode, prefill_cpu, decode_cpu))


def dp_attention(args: argparse.Namespace) -> dict:
    """Prefill and decode steps of ``--dp-seqs`` sequences: one process (all threads, one rank's
    threads), the group with data-parallel attention, the group with attention on rank 0."""
    from dsi.engine.runner import ModelRunner
    from dsi.model.config import TINY
    from dsi.model.weights import init_weights

    cfg, w = TINY, init_weights(TINY)
    blocks = 2 * args.dp_seqs + 1
    ep = resize(args.dp_ranks, args.dp_ranks, cfg.n_experts, args.redundant)
    single = ModelRunner(cfg, w, blocks, args.dp_seqs)
    times = {"ep1": step_times(single, args.dp_seqs, args.runs)}
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_rank(ep.size))
    try:
        times["ep1_rank_threads"] = step_times(single, args.dp_seqs, args.runs)
    finally:
        torch.set_num_threads(threads)
    group = ExpertGroup.start(cfg, w, EpOptions(ep))
    try:
        runner = group.runner(cfg, w, blocks, args.dp_seqs)
        times["dp"] = step_times(runner, args.dp_seqs, args.runs)
        share = [n / sum(runner.last_tokens) for n in runner.last_tokens]
        runner.data_parallel = False
        times["rank0"] = step_times(runner, args.dp_seqs, args.runs)
    finally:
        group.close()
    figures: dict = {"dp_ranks": ep.size, "dp_seqs": args.dp_seqs, "dp_rank_token_share": share}
    for phase, k in (("decode", 1), ("prefill", 0)):
        figures |= {f"dp_{phase}_ms_{name}": t[k] for name, t in times.items()}
        dp = times["dp"][k]
        figures |= {f"dp_{phase}_dp_vs_{name}": dp / t[k] for name, t in times.items() if name != "dp"}
        figures |= {f"dp_{phase}_rank0_cpu_ms_{name}": t[k + 2] for name, t in times.items()}
    return figures


def _main(args: argparse.Namespace) -> int:
    figures = {
        "experts": args.experts,
        "top_k": args.top_k,
        "ranks": args.ranks,
        "redundant_per_rank": args.redundant,
        "tokens_per_step": args.tokens,
        "steps": args.steps,
        "skew": args.skew,
    } | balance(args)
    if args.pause_ranks > 1:
        figures |= pause(args)
    if args.dp_ranks > 1:
        figures |= dp_attention(args)
    if args.json:
        print(json.dumps(figures))
        return 0
    for key, value in figures.items():
        print(f"{key:24s} {value:.3f}" if isinstance(value, float) else f"{key:24s} {value}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "eplb",
        help="rank load imbalance before / after EPLB on a skewed routing trace, and one rebalance's pause",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--experts", type=int, default=64, help="logical experts per layer")
    parser.add_argument("--top-k", type=int, default=6, help="experts per token")
    parser.add_argument("--ranks", type=int, default=8, help="EP ranks")
    parser.add_argument("--redundant", type=int, default=1, help="redundant expert slots per rank")
    parser.add_argument("--layers", type=int, default=4, help="MoE layers")
    parser.add_argument("--tokens", type=int, default=4096, help="tokens per step")
    parser.add_argument(
        "--steps", type=int, default=16, help="steps in the window (and in the held-out part)"
    )
    parser.add_argument("--skew", type=float, default=1.0, help="Zipf exponent of expert popularity")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--pause-ranks", type=int, default=4, help="ranks of the live group timed for the pause (1 = skip)"
    )
    parser.add_argument(
        "--dp-ranks",
        type=int,
        default=2,
        help="ranks of the group timed for data-parallel attention (1 = skip)",
    )
    parser.add_argument("--dp-seqs", type=int, default=64, help="sequences in each timed decode step")
    parser.add_argument("--runs", type=int, default=5, help="rebalances (and steps) timed")
    parser.set_defaults(func=_main)
