"""The DSpark draft of a model directory, trained on first use when absent (seeded, cached).

Each family has its own training settings (:func:`settings_for`): the random-weight tiny model
continues random ids; a trained chat model (the llama family, SmolLM2-135M-Instruct here)
answers chat questions of the training subjects (:mod:`dsi.model.chat_prompts`), answers that
stop at its end-of-sequence token. The same settings give the same draft (up to the thread
count's effect on float sums); a draft is about 13 MB for SmolLM2, so it is regenerated, not
shipped: ``dsi model train-draft --model DIR`` (or :func:`ensure_draft`, under a lock) writes
``DIR/draft.safetensors``.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from dsi.model.draft import DRAFT_FILE, load_draft, save_draft
from dsi.model.train_draft import TrainSettings, train

# SmolLM2: 128 answers of up to 128 tokens (about 13,000 examples), an 8,192-id draft vocabulary
# and 500 steps of 128 examples: about 4 minutes of collection and 6 of training on one core.
LLAMA_SETTINGS = TrainSettings(
    prompts=128, tokens=128, vocab=8192, ffn=768, batch=128, steps=500, ignore_eos=False
)


def settings_for(family: str) -> TrainSettings:
    return LLAMA_SETTINGS if family == "llama" else TrainSettings()


def train_for(
    directory: Path,
    cfg,
    weights: dict[str, torch.Tensor],
    settings: TrainSettings,
    log: Callable[[str], None] = print,
) -> tuple[dict[str, torch.Tensor], dict]:
    """Train the draft of a loaded model with ``settings`` (chat prompts for a chat model)."""
    prompts = None
    if cfg.family == "llama":
        from dsi.model.chat_prompts import chat_prompts

        prompts = chat_prompts(directory, settings.prompts, held_out=False, seed=settings.seed)
    return train(cfg, weights, settings, log, prompts)


def ensure_draft(
    directory: Path, cfg, weights: dict[str, torch.Tensor], log: Callable[[str], None] = print
) -> dict[str, torch.Tensor]:
    """The directory's draft, trained with the family's settings and saved when absent."""
    directory = Path(directory)
    with open(directory / (DRAFT_FILE + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / DRAFT_FILE).exists():
            log(f"{directory}: no {DRAFT_FILE}; training one (seeded, up to 20 minutes)")
            draft, report = train_for(directory, cfg, weights, settings_for(cfg.family), log)
            save_draft(directory, draft)
            log(f"draft trained: {report}")
    return load_draft(directory, cfg.hidden)


def with_overrides(settings: TrainSettings, **changes) -> TrainSettings:
    """``settings`` with the changes that are not None."""
    return replace(settings, **{k: v for k, v in changes.items() if v is not None})
