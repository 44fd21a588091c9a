"""The V4 vocabulary as the grammar engine sees it.

Every added token (BOS/EOS, ``<｜User｜>``, ``</think>``, ``｜DSML｜`` and the reserved ones) is
flagged special here, whatever ``tokenizer.json`` says: a special token never matches grammar
text, only an explicit ``<[id]>`` in a grammar. So a JSON string cannot contain a real
``</think>`` or EOS id, and a DSML block can only be opened by the real ``｜DSML｜`` id (128825),
which is what the output parser requires (RECIPE.md).
"""

from __future__ import annotations

import functools
import json

from dsi.tokenizer import EOS_ID, tokenizer_path

VOCAB_SIZE = 129_280
THINK_END_ID = 128822  # </think>
DSML_ID = 128825  # ｜DSML｜


def special_vocab_json() -> str:
    """``tokenizer.json`` text with every added token flagged special."""
    data = json.loads(tokenizer_path().read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        token["special"] = True
    return json.dumps(data)


@functools.lru_cache(maxsize=1)
def guidance_tokenizer():  # -> llguidance.LLTokenizer (imported lazily: a heavy native module)
    """The llguidance tokenizer over the V4 vocabulary (about 1 s to build; built once)."""
    import llguidance

    return llguidance.LLTokenizer(special_vocab_json(), n_vocab=VOCAB_SIZE, eos_token=EOS_ID)
