"""The Gemma 3 family: sliding-window and global attention layers interleaved, QK-norm, pre- and
post-norms around attention and MLP, scaled embeddings, one RoPE base per layer type.

    x = embed[tokens] * sqrt(H)                                                  [T, H]
    per layer:  a = attn(rope(qnorm(q(n1(x)))), rope(knorm(k(n1(x)))), v(n1(x)))  causal, GQA;
                    a sliding layer sees the last `window` positions (itself included)
                x += n2(o_proj(a))
                x += n4(down(gelu_tanh(gate(n3(x))) * up(n3(x))))
    logits = norm(x) @ embed.T                                                   [T, V]

Layer types follow the checkpoint's ``layer_types`` (Gemma 3: five sliding layers, then one
global, repeated). Global layers rotate with ``rope_theta`` (1e6), sliding layers with
``rope_local`` (1e4). Every norm is an RMSNorm whose Hugging Face weight w scales by ``1 + w``;
the loader adds the 1, so ``ops.rms_norm`` applies the weights as they are kept here.

The cache follows the layer types: global layers keep K and V of every position in Block KV
pages (:mod:`dsi.kvcache.layout_dense`); sliding layers keep a SWA ring of ``window + 6``
positions in the state slot. There is no consumer half: every layer runs on every computed
position (``keep = 0`` in the hit arithmetic of :mod:`dsi.model.hits`; see ``Gemma3Config``).

Weights are ``x @ w`` operands ([in, out]); names (H = hidden, D = head_dim, Q = heads * D,
K = kv_heads * D, F = intermediate, V = vocab)::

    embed [V, H]   final_norm [H]
    layers.{i}.attn_norm [H]  wq [H, Q]  wk, wv [H, K]  q_norm, k_norm [D]  wo [Q, H]  post_attn_norm [H]
    layers.{i}.ffn_norm [H]   w_gate, w_up [H, F]  w_down [F, H]  post_ffn_norm [H]
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

ROLLBACK = 6  # ring positions beyond the window, for speculative rollback (as the V4 shape)


@dataclass(slots=True, frozen=True)
class Gemma3Config:
    name: str
    vocab_size: int
    hidden: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    window: int  # tokens a sliding layer's query sees, itself included
    sliding: tuple[bool, ...]  # per layer: True = sliding-window layer, False = global
    rope_theta: float = 1_000_000.0  # global layers
    rope_local: float = 10_000.0  # sliding layers
    query_scale: float = 256.0  # query_pre_attn_scalar: scores are q.k / sqrt(query_scale)
    norm_eps: float = 1e-6
    final_softcap: float | None = None
    max_context: int = 32_768
    bos_id: int = 2
    eos_id: int = 1
    block_size: int = 128

    def __post_init__(self) -> None:
        problems = []
        if self.n_heads % self.n_kv_heads:
            problems.append("n_heads must be a multiple of n_kv_heads")
        if self.head_dim % 2:
            problems.append("head_dim must be even (rotary pairs)")
        if len(self.sliding) != self.n_layers:
            problems.append(f"{len(self.sliding)} layer types for {self.n_layers} layers")
        if self.window < 1 or min(self.vocab_size, self.hidden, self.n_layers, self.intermediate) <= 0:
            problems.append("sizes must be positive")
        if problems:
            raise ValueError(f"gemma3 config {self.name!r}: " + "; ".join(problems))

    @property
    def family(self) -> str:
        return "gemma3"

    @property
    def full_layers(self) -> tuple[int, ...]:
        """Global layers, in order: their K/V live in Block KV pages."""
        return tuple(i for i, s in enumerate(self.sliding) if not s)

    @property
    def sliding_layers(self) -> tuple[int, ...]:
        """Sliding-window layers, in order: each owns a SWA ring (ring index = rank here)."""
        return tuple(i for i, s in enumerate(self.sliding) if s)

    # The cache shape in the names the engine's cache code reads (state slots, ring snapshots,
    # RequestState, EngineShape). Every sliding layer is a "producer" in the V4 sense: its ring
    # is what an exact hit loads, and a ring snapshot holds the last `window` positions of each.
    # No consumer half: keep = 0 puts consumer_start at the prompt's end, so the hit arithmetic
    # of dsi.model.hits gives R = max(0, H - window) and exact hits up to max_hit.
    kv_sources = ()
    keep = 0

    @property
    def ring(self) -> int:
        return self.window + ROLLBACK

    @property
    def ring_layers(self) -> int:
        return len(self.sliding_layers)

    @property
    def n_producer(self) -> int:
        return len(self.sliding_layers)

    @property
    def snapshot_tokens(self) -> int:
        """Positions of each ring in a ring snapshot: the window before the boundary."""
        return self.window

    def theta(self, layer: int) -> float:
        return self.rope_local if self.sliding[layer] else self.rope_theta

    @classmethod
    def from_hf(cls, data: dict) -> Gemma3Config:
        """From a Hugging Face ``config.json`` of ``model_type: gemma3_text``."""
        if data.get("model_type") != "gemma3_text":
            raise ValueError(f"not a gemma3_text config (model_type {data.get('model_type')!r})")
        if data.get("attn_logit_softcapping") is not None:
            raise ValueError("attention logit soft-capping is not supported")
        n = int(data["num_hidden_layers"])
        types = data.get("layer_types") or [
            "sliding_attention" if (i + 1) % int(data.get("sliding_window_pattern", 6)) else "full_attention"
            for i in range(n)
        ]
        rope_params = data.get("rope_parameters") or {}
        for kind in ("full_attention", "sliding_attention"):
            kind_type = (rope_params.get(kind) or {}).get("rope_type", "default")
            if kind_type != "default":
                raise ValueError(f"rope type {kind_type!r} of {kind} layers is not supported")
        scaling = data.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ValueError(f"rope scaling {scaling!r} is not supported")
        glob = (rope_params.get("full_attention") or {}).get(
            "rope_theta", data.get("rope_theta", 1_000_000.0)
        )
        local = (rope_params.get("sliding_attention") or {}).get(
            "rope_theta", data.get("rope_local_base_freq", 10_000.0)
        )
        eos = data.get("eos_token_id", 1)
        heads = int(data["num_attention_heads"])
        return cls(
            name=str(data.get("name", "gemma3")),
            vocab_size=int(data["vocab_size"]),
            hidden=int(data["hidden_size"]),
            n_layers=n,
            n_heads=heads,
            n_kv_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim", 256)),
            intermediate=int(data["intermediate_size"]),
            window=int(data["sliding_window"]),
            sliding=tuple(t == "sliding_attention" for t in types),
            rope_theta=float(glob),
            rope_local=float(local),
            query_scale=float(data.get("query_pre_attn_scalar", 256)),
            norm_eps=float(data.get("rms_norm_eps", 1e-6)),
            final_softcap=data.get("final_logit_softcapping"),
            max_context=int(data.get("max_position_embeddings", 32_768)),
            bos_id=int(data.get("bos_token_id", 2)),
            eos_id=int(eos[0] if isinstance(eos, list) else eos),
        )


_NORMS = {  # ours -> Hugging Face (after "model.layers.{i}."); applied as 1 + w
    "attn_norm": "input_layernorm",
    "q_norm": "self_attn.q_norm",
    "k_norm": "self_attn.k_norm",
    "post_attn_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffn_norm": "post_feedforward_layernorm",
}
_PROJ = {
    "wq": "self_attn.q_proj",
    "wk": "self_attn.k_proj",
    "wv": "self_attn.v_proj",
    "wo": "self_attn.o_proj",
    "w_gate": "mlp.gate_proj",
    "w_up": "mlp.up_proj",
    "w_down": "mlp.down_proj",
}


def load_gemma3(directory: Path) -> tuple[Gemma3Config, dict[str, torch.Tensor]]:
    """A Hugging Face gemma3_text checkpoint -> (config, fp32 weights in this module's names)."""
    directory = Path(directory)
    cfg = Gemma3Config.from_hf(json.loads((directory / "config.json").read_text()))
    hf: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        hf |= load_file(str(f))
    if not hf:
        raise ValueError(f"{directory}: no *.safetensors files")

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"{directory}: weight {name} is missing")
        return hf[name].to(torch.float32)

    w = {"embed": take("model.embed_tokens.weight"), "final_norm": 1.0 + take("model.norm.weight")}
    for i in range(cfg.n_layers):
        p, hp = f"layers.{i}.", f"model.layers.{i}."
        for ours, theirs in _NORMS.items():
            w[p + ours] = 1.0 + take(hp + theirs + ".weight")
        for ours, theirs in _PROJ.items():
            w[p + ours] = take(hp + theirs + ".weight").T.contiguous()
    _check_shapes(cfg, w, directory)
    return cfg, w


def _check_shapes(cfg: Gemma3Config, w: dict[str, torch.Tensor], directory: Path) -> None:
    h, d, f = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, k = cfg.n_heads * d, cfg.n_kv_heads * d
    expected = {"embed": (cfg.vocab_size, h), "final_norm": (h,)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        expected |= {p + n: (h,) for n in ("attn_norm", "post_attn_norm", "ffn_norm", "post_ffn_norm")}
        expected |= {p + "q_norm": (d,), p + "k_norm": (d,), p + "wq": (h, q), p + "wk": (h, k)}
        expected |= {p + "wv": (h, k), p + "wo": (q, h), p + "w_gate": (h, f), p + "w_up": (h, f)}
        expected[p + "w_down"] = (f, h)
    for name, shape in expected.items():
        if tuple(w[name].shape) != shape:
            raise ValueError(f"{directory}: {name} has shape {tuple(w[name].shape)}, expected {shape}")


def embed(cfg: Gemma3Config, w: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """Scaled token embeddings [T, H] (the scale rounded to fp32 first, as the checkpoint's code)."""
    return w["embed"][ids] * torch.tensor(math.sqrt(cfg.hidden), dtype=torch.float32)


def qkv(
    cfg: Gemma3Config,
    w: dict[str, torch.Tensor],
    i: int,
    x: torch.Tensor,
    pos: torch.Tensor,
    mm: Matmul = torch.matmul,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Layer i's normed, rotated and pre-scaled queries [T, Hq, D], normed and rotated keys and
    values [T, Hkv, D] of hidden x [T, H]. Queries carry ``sqrt(D / query_scale)`` so that the
    attention's own ``1 / sqrt(D)`` gives the model's ``1 / sqrt(query_scale)`` (1 when equal)."""
    p, t, d = f"layers.{i}.", x.shape[0], cfg.head_dim
    xn = rms_norm(x, w[p + "attn_norm"], cfg.norm_eps)
    q = rms_norm(mm(xn, w[p + "wq"]).view(t, cfg.n_heads, d), w[p + "q_norm"], cfg.norm_eps)
    k = rms_norm(mm(xn, w[p + "wk"]).view(t, cfg.n_kv_heads, d), w[p + "k_norm"], cfg.norm_eps)
    v = mm(xn, w[p + "wv"]).view(t, cfg.n_kv_heads, d)
    q, k = rope(q, pos, cfg.theta(i)), rope(k, pos, cfg.theta(i))
    if cfg.query_scale != d:
        q = q * math.sqrt(d / cfg.query_scale)
    return q, k, v


def finish_layer(
    cfg: Gemma3Config,
    w: dict[str, torch.Tensor],
    i: int,
    x: torch.Tensor,
    attn: torch.Tensor,
    mm: Matmul = torch.matmul,
) -> torch.Tensor:
    """Residual adds of layer i: the post-normed attention output attn [T, Hq * D], then the
    pre- and post-normed GeGLU MLP. -> [T, H]."""
    p, eps = f"layers.{i}.", cfg.norm_eps
    x = x + rms_norm(mm(attn, w[p + "wo"]), w[p + "post_attn_norm"], eps)
    xn = rms_norm(x, w[p + "ffn_norm"], eps)
    h = F.gelu(mm(xn, w[p + "w_gate"]), approximate="tanh") * mm(xn, w[p + "w_up"])
    return x + rms_norm(mm(h, w[p + "w_down"]), w[p + "post_ffn_norm"], eps)


def logits_of(
    cfg: Gemma3Config, w: dict[str, torch.Tensor], x: torch.Tensor, mm: Matmul = torch.matmul
) -> torch.Tensor:
    """Final norm and the tied output projection: hidden [T, H] -> logits [T, V]."""
    out = mm(rms_norm(x, w["final_norm"], cfg.norm_eps), w["embed"].T)
    if cfg.final_softcap:
        out = torch.tanh(out / cfg.final_softcap) * cfg.final_softcap
    return out
