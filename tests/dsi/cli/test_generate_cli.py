"""dsi generate --chat on an imported SmolLM2: the model's own template, the engine, and Paris."""

import json

from dsi.cli.main import main
from tests.smollm2 import GREEDY_TOKENS, PROMPTS, one_torch_thread


def test_generate_chat_answers_the_capital_question(smollm2_dir, smollm2_greedy, capsys):
    prompts, expected = smollm2_greedy
    with one_torch_thread():
        rc = main(
            [
                "generate",
                "--model",
                str(smollm2_dir),
                "--prompt",
                PROMPTS[0],
                "--chat",
                "--max-tokens",
                str(GREEDY_TOKENS),
                "--json",
            ]
        )
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert out["prompt_ids"] == prompts[0]
    assert out["token_ids"] == expected[0][: len(out["token_ids"])]  # stops at <|im_end|> (EOS)
    assert out["finish_reason"] == "stop" and out["token_ids"][-1] == 2
    assert "Paris" in out["text"]
