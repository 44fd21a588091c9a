"""``dsi model init|info|train-draft|import-gguf``: make a seeded model directory; print a config's
shape and bytes; train its DSpark draft (:mod:`dsi.model.train_draft`); turn a GGUF file into a
model directory (:mod:`dsi.model.gguf_import`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dsi.kvcache.layout import account, engine_block_bytes, engine_state_bytes
from dsi.model.config import CONFIGS, get_config
from dsi.model.vit import init_vision_weights, save_vision, vision_config_of
from dsi.model.weights import init_weights, param_count, save_model


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("model", help="create or describe a model")
    cmds = parser.add_subparsers(dest="model_command", required=True)
    init = cmds.add_parser("init", help="write a seeded model directory (config.json + model.safetensors)")
    init.add_argument("--config", choices=["tiny"], default="tiny")
    init.add_argument("--out", required=True, type=Path)
    init.add_argument("--seed", type=int, default=0)
    init.set_defaults(func=_init)
    info = cmds.add_parser("info", help="shape, parameter count and cache bytes of a built-in config")
    info.add_argument("--config", choices=sorted(CONFIGS), default="tiny")
    info.add_argument("--json", action="store_true")
    info.set_defaults(func=_info)
    draft = cmds.add_parser(
        "train-draft", help="self-distil the DSpark draft on the model's own greedy outputs (seeded)"
    )
    draft.add_argument(
        "--model", required=True, type=Path, help="model directory (written: draft.safetensors)"
    )
    draft.add_argument("--prompts", type=int, help="default 64 (tiny), 192 (llama)")
    draft.add_argument("--tokens", type=int, help="greedy output tokens per prompt: 96 (tiny), 128 (llama)")
    draft.add_argument("--steps", type=int, help="default 600 (tiny), 800 (llama)")
    draft.add_argument("--max-minutes", type=float, default=20.0)
    draft.add_argument("--seed", type=int, default=0)
    draft.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared machine)")
    draft.add_argument("--json", action="store_true")
    draft.set_defaults(func=_train_draft)
    gguf = cmds.add_parser(
        "import-gguf", help="dequantise a GGUF file into a model directory (llama or gemma3)"
    )
    gguf.add_argument("file", type=Path)
    gguf.add_argument("--out", required=True, type=Path)
    gguf.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    gguf.set_defaults(func=_import_gguf)


def _init(args: argparse.Namespace) -> int:
    from dataclasses import replace

    cfg = replace(get_config(args.config), seed=args.seed)
    save_model(args.out, cfg, init_weights(cfg))
    vision = vision_config_of(args.config)
    if vision is not None:  # the shape's vision encoder, beside it (vision.json, vision.safetensors)
        save_vision(args.out, vision, init_vision_weights(vision))
    print(f"wrote {cfg.name} ({param_count(cfg) / 1e6:.1f} M parameters) to {args.out}")
    return 0


def _train_draft(args: argparse.Namespace) -> int:
    import sys

    import torch

    from dsi.model.draft import save_draft
    from dsi.model.draft_prepare import settings_for, train_for, with_overrides
    from dsi.model.family import load_model_dir
    from dsi.model.prepare import ensure_model

    torch.set_num_threads(args.threads)
    cfg, weights = load_model_dir(ensure_model(args.model, "tiny"))
    settings = with_overrides(
        settings_for(cfg.family),
        prompts=args.prompts,
        tokens=args.tokens,
        steps=args.steps,
        max_seconds=60 * args.max_minutes,
        seed=args.seed,
    )
    draft, report = train_for(args.model, cfg, weights, settings, log=lambda m: print(m, file=sys.stderr))
    report["path"] = str(save_draft(args.model, draft))
    print(json.dumps(report) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))
    return 0


def _info(args: argparse.Namespace) -> int:
    cfg = get_config(args.config)
    acc = account(cfg)
    data = {
        "config": cfg.name,
        "parameters": param_count(cfg),
        "layers": cfg.n_layers,
        "producer_layers": cfg.n_producer,
        "kv_sources": list(cfg.kv_sources),
        "hidden": cfg.hidden,
        "experts": cfg.n_experts,
        "top_k": cfg.top_k,
        "window": cfg.window,
        "ring": cfg.ring,
        "keep": cfg.keep,
        "block_size": cfg.block_size,
        "block_bytes": acc.block,
        "block_kib": round(acc.block / 1024, 2),
        "state_slot_bytes": acc.state_slot,
        "engine_block_bytes_fp32": engine_block_bytes(cfg),
        "engine_state_slot_bytes_fp32": engine_state_bytes(cfg),
    }
    if args.json:
        print(json.dumps(data))
        return 0
    print(
        f"{cfg.name}: {data['parameters'] / 1e9:.2f} B parameters, {cfg.n_layers} layers "
        f"({cfg.n_producer} producer, KV sources {list(cfg.kv_sources)}), hidden {cfg.hidden}, "
        f"{cfg.n_experts} experts top-{cfg.top_k} + 1 shared"
    )
    for name, value in acc.table():
        print(f"  {name:<28} {value}")
    return 0


def _import_gguf(args: argparse.Namespace) -> int:
    import torch

    from dsi.model.gguf_import import import_gguf

    cfg = import_gguf(args.file, args.out, getattr(torch, args.dtype))
    print(
        f"wrote {cfg['name']} ({cfg['family']}, {cfg['num_hidden_layers']} layers, vocab {cfg['vocab_size']}, "
        f"{args.dtype}) to {args.out}"
    )
    return 0
