"""The Llama model family: dense decoders with RMSNorm, RoPE, grouped-query attention and SwiGLU.

    x = embed[tokens]                                        [T, H]
    per layer:  x += o_proj(attn(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))   causal, GQA
                x += down(silu(gate(norm(x))) * up(norm(x)))
    logits = norm(x) @ lm_head                               [T, V] (lm_head = embed when tied)

Every layer is a full-attention layer: its cache is K and V of every position (Block KV pages
only; no SWA ring, no compressor state). A model directory is a Hugging Face checkpoint
(``config.json`` + ``model.safetensors``), as ``dsi model import-gguf`` writes one.

Weights are kept as ``x @ w`` operands ([in, out]); names (H = hidden, D = head_dim, Q = heads * D,
K = kv_heads * D, F = intermediate, V = vocab)::

    embed [V, H]   lm_head [V, H]   final_norm [H]
    layers.{i}.attn_norm [H]  wq [H, Q]  wk, wv [H, K]  wo [Q, H]
    layers.{i}.ffn_norm [H]   w_gate, w_up [H, F]  w_down [F, H]

:func:`fuse_projections` (applied by :func:`load_llama`) also keeps each layer's products that read
the same input as one weight, so that the engine runs one product where the naive math runs
two or three; the separate names stay, as column views of the fused ones (no second copy)::

    layers.{i}.wqkv [H, Q + 2K] = [wq | wk | wv]     layers.{i}.w_gate_up [H, 2F] = [w_gate | w_up]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from dsi.model.ops import Matmul, rms_norm, rope


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    name: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    max_context: int = 8192  # tokens (prompt + output)
    tied: bool = True  # the output projection is the embedding
    bos_id: int = 1
    eos_id: int = 2
    block_size: int = 128  # tokens per Block KV page

    def __post_init__(self) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append("n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            problems.append("head_dim must be even (rotary pairs)")
        if min(self.vocab_size, self.hidden, self.n_layers, self.intermediate) <= 0:
            problems.append("sizes must be positive")
        if problems:
            raise ValueError(f"llama config {self.name!r}: " + "; ".join(problems))

    # The cache shape in the names the engine's cache code reads (state slots, RequestState,
    # EngineShape): every layer is full attention, so a state slot holds no SWA ring (length 0)
    # and no compressor state, no layer is a ring-snapshot "producer", and there is no
    # decoder-side bounded replay (keep None).
    ring = 0
    window = 0
    kv_sources = ()
    n_producer = 0
    keep = None

    @property
    def family(self) -> str:
        return "llama"

    @property
    def full_layers(self) -> tuple[int, ...]:
        """Layers whose K/V live in Block KV pages: all of them."""
        return tuple(range(self.n_layers))

    @property
    def ring_layers(self) -> int:
        """Rings per state slot (each of length ``ring`` = 0)."""
        return self.n_layers

    @property
    def snapshot_tokens(self) -> int:
        return self.block_size

    @classmethod
    def from_hf(cls, data: dict) -> LlamaConfig:
        """From a Hugging Face ``config.json`` of ``model_type: llama``."""
        if data.get("model_type") != "llama":
            raise ValueError(f"not a llama config (model_type {data.get('model_type')!r})")
        scaling = data.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope scaling {scaling!r} is not supported")
        heads = int(data["num_attention_heads"])
        hidden = int(data["hidden_size"])
        eos = data.get("eos_token_id", 2)
        return cls(
            name=str(data.get("name", "llama")),
            vocab_size=int(data["vocab_size"]),
            hidden=hidden,
            n_layers=int(data["num_hidden_layers"]),
            n_heads=heads,
            n_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or hidden // heads),
            intermediate=int(data["intermediate_size"]),
            rope_theta=float(data.get("rope_theta", 10_000.0)),
            norm_eps=float(data.get("rms_norm_eps", 1e-5)),
            max_context=int(data.get("max_position_embeddings", 8192)),
            tied=bool(data.get("tie_word_embeddings", False)),
            bos_id=int(data.get("bos_token_id") or 1),
            eos_id=int(eos[0] if isinstance(eos, list) else eos),
        )


def load_llama(directory: Path) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """A Hugging Face llama checkpoint -> (config, fp32 weights in the names of the module docstring)."""
    directory = Path(directory)
    cfg = LlamaConfig.from_hf(json.loads((directory / "config.json").read_text()))
    hf = {}
    for f in sorted(directory.glob("*.safetensors")):
        hf |= load_file(str(f))
    if not hf:
        raise ValueError(f"{directory}: no *.safetensors files")

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"{directory}: weight {name} is missing")
        return hf[name].to(torch.float32)

    w = {"embed": take("model.embed_tokens.weight"), "final_norm": take("model.norm.weight")}
    w["lm_head"] = w["embed"] if cfg.tied or "lm_head.weight" not in hf else take("lm_head.weight")
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
    proj = {
        "wq": "self_attn.q_proj",
        "wk": "self_attn.k_proj",
        "wv": "self_attn.v_proj",
        "wo": "self_attn.o_proj",
        "w_gate": "mlp.gate_proj",
        "w_up": "mlp.up_proj",
        "w_down": "mlp.down_proj",
    }
    for i in range(cfg.n_layers):
        p, hp = f"layers.{i}.", f"model.layers.{i}."
        for ours, theirs in names.items():
            w[p + ours] = take(hp + theirs + ".weight")
        for ours, theirs in proj.items():
            w[p + ours] = take(hp + theirs + ".weight").T.contiguous()
    _check_shapes(cfg, w, directory)
    return cfg, fuse_projections(cfg, w)


def fuse_projections(cfg: LlamaConfig, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights with ``wqkv`` and ``w_gate_up`` per layer (see the module docstring); wq, wk, wv,
    w_gate and w_up become views of them. Weights that already have them are returned as they are."""
    if "layers.0.wqkv" in w:
        return w
    out = dict(w)
    q, k, f = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.intermediate
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        qkv_w = torch.cat([w[p + "wq"], w[p + "wk"], w[p + "wv"]], dim=1)
        gate_up = torch.cat([w[p + "w_gate"], w[p + "w_up"]], dim=1)
        out[p + "wqkv"], out[p + "w_gate_up"] = qkv_w, gate_up
        out[p + "wq"], out[p + "wk"], out[p + "wv"] = qkv_w[:, :q], qkv_w[:, q : q + k], qkv_w[:, q + k :]
        out[p + "w_gate"], out[p + "w_up"] = gate_up[:, :f], gate_up[:, f:]
    return out


def _check_shapes(cfg: LlamaConfig, w: dict[str, torch.Tensor], directory: Path) -> None:
    h, q, k, f = cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim, cfg.intermediate
    expected = {"embed": (cfg.vocab_size, h), "lm_head": (cfg.vocab_size, h), "final_norm": (h,)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        expected |= {
            p + "attn_norm": (h,),
            p + "wq": (h, q),
            p + "wk": (h, k),
            p + "wv": (h, k),
            p + "wo": (q, h),
            p + "ffn_norm": (h,),
            p + "w_gate": (h, f),
            p + "w_up": (h, f),
            p + "w_down": (f, h),
        }
    for name, shape in expected.items():
        if tuple(w[name].shape) != shape:
            raise ValueError(f"{directory}: {name} has shape {tuple(w[name].shape)}, expected {shape}")


def qkv(
    cfg: LlamaConfig,
    w: dict[str, torch.Tensor],
    i: int,
    x: torch.Tensor,
    pos: torch.Tensor,
    mm: Matmul = torch.matmul,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer i's rotated queries [T, Hq, D], rotated keys and values [T, Hkv, D] of hidden x [T, H]."""
    p, t = f"layers.{i}.", x.shape[0]
    xn = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
    q = mm(xn, w[p + "wq"]).view(t, cfg.n_heads, cfg.head_dim)
    k = mm(xn, w[p + "wk"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    v = mm(xn, w[p + "wv"]).view(t, cfg.n_kv_heads, cfg.head_dim)
    return rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta), v


def finish_layer(
    cfg: LlamaConfig,
    w: dict[str, torch.Tensor],
    i: int,
    x: torch.Tensor,
    attn: torch.Tensor,
    mm: Matmul = torch.matmul,
) -> torch.Tensor:
    """Residual adds of layer i: attention output attn [T, Hq * D], then the SwiGLU MLP. -> [T, H]."""
    p = f"layers.{i}."
    x = x + mm(attn, w[p + "wo"])
    xn = rms_norm(x, w[p + "ffn_norm"], cfg.norm_eps)
    return x + mm(F.silu(mm(xn, w[p + "w_gate"])) * mm(xn, w[p + "w_up"]), w[p + "w_down"])


def causal_attend(
    q: torch.Tensor, q_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """q: [Tq, Hq, D]; k, v: [Tk, Hkv, D]; a query at t sees keys with pos <= t. -> [Tq, Hq * D]."""
    tq, hq, d = q.shape
    group = hq // k.shape[1]
    s = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(group, dim=1)) / math.sqrt(d)
    s = s.masked_fill(~(k_pos[None, :] <= q_pos[:, None])[None], float("-inf"))
    out = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.repeat_interleave(group, dim=1))
    return out.reshape(tq, hq * d)


@torch.no_grad()
def llama_logits(cfg: LlamaConfig, w: dict[str, torch.Tensor], tokens: list[int]) -> torch.Tensor:
    """Naive reference forward, no cache: logits [T, V] of every position."""
    pos = torch.arange(len(tokens))
    x = w["embed"][torch.tensor(tokens, dtype=torch.long)]
    for i in range(cfg.n_layers):
        q, k, v = qkv(cfg, w, i, x, pos)
        x = finish_layer(cfg, w, i, x, causal_attend(q, pos, k, v, pos))
    return rms_norm(x, w["final_norm"], cfg.norm_eps) @ w["lm_head"].T


@torch.no_grad()
def llama_generate(
    cfg: LlamaConfig,
    w: dict[str, torch.Tensor],
    prompt: list[int],
    max_tokens: int,
    stop: tuple[int, ...] = (),
) -> list[int]:
    """Greedy continuation by full recomputation (stops after a token in ``stop``)."""
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        nxt = int(llama_logits(cfg, w, tokens)[-1].argmax())
        out.append(nxt)
        tokens.append(nxt)
        if nxt in stop:
            break
    return out
