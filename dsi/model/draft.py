"""DSpark draft module: proposes up to ``max_drafts`` tokens, each with a confidence.

The draft is fed by the target's last hidden state (the last main layer's output, before the
final norm) at position t and the token the target chose for t + 1; it proposes the token of
t + 2 and a hidden state of its own, which feeds the next draft step with the proposed token::

    x_1 = proj([norm(h_t) ; norm(embed[y_{t+1}])])      x_{i+1} = proj([norm(x_i) ; norm(embed[d_i])])
    x   = x + swiglu_j(norm_j(x))      for each draft layer j (residual MLP blocks, no attention)
    z   = norm_out(x)
    d   = argmax over the draft vocabulary of z @ embed[vocab].T      (or a draw at the request's temperature)
    c   = sigmoid(z @ conf_w + conf_a * log max softmax + conf_b)     the estimated acceptance probability

The draft vocabulary (``vocab``, [Vd] target ids) is the set of ids the target produced most
often in the draft's training data: scoring 4,096 ids instead of 129,280 makes a draft step about
30x cheaper than the target's own output projection. The output embedding is the target's (tied).

Weights (H = target hidden, F = ``ffn``, L = ``layers``, Vd = draft vocabulary)::

    draft.hnorm, draft.enorm   [H]        draft.proj  [2H, H]
    draft.{j}.norm [H]   draft.{j}.w1, .w3 [H, F]   draft.{j}.w2 [F, H]      j < L
    draft.out_norm [H]   draft.conf_w [H]   draft.conf_ab [2]   draft.vocab [Vd] (int64)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from dsi.model.ops import Matmul, rms_norm

DRAFT_FILE = "draft.safetensors"


@dataclass(slots=True, frozen=True)
class DraftShape:
    hidden: int
    layers: int
    ffn: int
    vocab: int  # draft vocabulary size

    @classmethod
    def of(cls, w: dict[str, torch.Tensor]) -> DraftShape:
        layers = sum(1 for k in w if k.endswith(".w1"))
        return cls(w["draft.proj"].shape[1], layers, w["draft.0.w1"].shape[1], w["draft.vocab"].shape[0])


def init_draft(
    hidden: int, vocab: torch.Tensor, layers: int = 2, ffn: int = 512, seed: int = 0
) -> dict[str, torch.Tensor]:
    """Seeded untrained draft weights over the draft vocabulary ``vocab`` ([Vd] target ids)."""
    gen = torch.Generator().manual_seed(seed)

    def dense(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * scale / math.sqrt(shape[0])

    w = {
        "draft.hnorm": torch.ones(hidden),
        "draft.enorm": torch.ones(hidden),
        "draft.proj": dense(2 * hidden, hidden),
        "draft.out_norm": torch.ones(hidden),
        "draft.conf_w": torch.zeros(hidden),
        "draft.conf_ab": torch.tensor([1.0, 0.0]),
        "draft.vocab": vocab.to(torch.long).clone(),
    }
    for j in range(layers):
        w |= {
            f"draft.{j}.norm": torch.ones(hidden),
            f"draft.{j}.w1": dense(hidden, ffn),
            f"draft.{j}.w3": dense(hidden, ffn),
            f"draft.{j}.w2": dense(ffn, hidden, scale=0.5),
        }
    return w


def draft_step(
    w: dict[str, torch.Tensor],
    embed: torch.Tensor,
    h: torch.Tensor,
    tokens: torch.Tensor,
    eps: float = 1e-6,
    out_embed: torch.Tensor | None = None,
    mm: Matmul = torch.matmul,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One draft step for N sequences. h: [N, H] (target or draft hidden); tokens: [N] target ids.
    ``out_embed``: ``embed[w["draft.vocab"]]`` [Vd, H] made once (a server's draft steps reuse it).
    ``mm``: the products (an engine's batch-invariant ones, :func:`dsi.engine.invariant.mm`).

    Returns (next hidden [N, H], logits over the draft vocabulary [N, Vd], confidence logit [N]
    before the sigmoid). Differentiable (the training script calls it too)."""
    e = embed[tokens]
    x = torch.cat([rms_norm(h, w["draft.hnorm"], eps), rms_norm(e, w["draft.enorm"], eps)], dim=-1)
    x = mm(x, w["draft.proj"])
    j = 0
    while f"draft.{j}.w1" in w:
        xn = rms_norm(x, w[f"draft.{j}.norm"], eps)
        x = x + mm(F.silu(mm(xn, w[f"draft.{j}.w1"])) * mm(xn, w[f"draft.{j}.w3"]), w[f"draft.{j}.w2"])
        j += 1
    z = rms_norm(x, w["draft.out_norm"], eps)
    logits = mm(z, (embed[w["draft.vocab"]] if out_embed is None else out_embed).T)
    top = torch.log_softmax(logits, dim=-1).amax(-1).detach()
    a, b = w["draft.conf_ab"][0], w["draft.conf_ab"][1]
    conf = mm(z, w["draft.conf_w"][:, None])[:, 0] + a * top + b
    return x, logits, conf


def save_draft(directory: Path, w: dict[str, torch.Tensor]) -> Path:
    path = Path(directory) / DRAFT_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in w.items()}, str(path))
    return path


def load_draft(directory: Path, hidden: int) -> dict[str, torch.Tensor]:
    """The draft of a model directory; ValueError naming the file when absent or of another shape."""
    path = Path(directory) / DRAFT_FILE
    if not path.exists():
        raise ValueError(
            f"{path}: no draft weights (make them with `dsi model train-draft --model {directory}`)"
        )
    w = load_file(str(path))
    needed = {"draft.proj", "draft.0.w1", "draft.vocab", "draft.conf_w", "draft.conf_ab", "draft.out_norm"}
    missing = sorted(needed - set(w))
    if missing:
        raise ValueError(f"{path}: draft weights missing: {', '.join(missing)}")
    if DraftShape.of(w).hidden != hidden:
        raise ValueError(
            f"{path}: draft hidden {DraftShape.of(w).hidden} does not match the model's {hidden}"
        )
    return w
