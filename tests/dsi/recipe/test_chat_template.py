"""The generic chat-template renderer: SmolLM2's own template gives transformers' prompt ids, the
model's greedy answer to the capital question names Paris, and DeepSeek-only features are refused."""

import pytest

from dsi.errors import InvalidRequest
from dsi.recipe.chat_template import ChatTemplate, plain_messages
from dsi.recipe.conversation import (
    AssistantMessage,
    Conversation,
    Effort,
    ImageRef,
    SystemMessage,
    ToolResult,
    ToolSpec,
    UserMessage,
)
from tests.smollm2 import PROMPTS, chat_ids


def _ask(question: str) -> Conversation:
    return Conversation((UserMessage((question,)),))


def test_render_equals_transformers_chat_template(smollm2_dir):
    template = ChatTemplate.load(smollm2_dir)
    for question in PROMPTS[:3]:
        assert template.render(_ask(question)) == chat_ids(smollm2_dir, question)
    text = template.prompt_text(
        Conversation(
            (
                SystemMessage(("Be brief.",)),
                UserMessage(("Hi",)),
                AssistantMessage("Hello!"),
                UserMessage(("Bye",)),
            )
        )
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_greedy_answer_to_the_capital_question_names_paris(smollm2_dir, smollm2_greedy):
    prompts, outputs = smollm2_greedy
    template = ChatTemplate.load(smollm2_dir)
    assert template.render(_ask(PROMPTS[0])) == prompts[0]  # the engine tests' prompt 0
    assert "Paris" in template.tokenizer.decode(outputs[0], skip_special_tokens=True)


@pytest.mark.parametrize(
    "conv, match",
    [
        (Conversation((UserMessage(("x",)),), tools=(ToolSpec("f"),)), "tools"),
        (Conversation((UserMessage(("x",)),), effort=Effort.MAX), "reasoning effort"),
        (Conversation((UserMessage(("x",)), ToolResult("c1", ("y",)))), "ToolResult"),
        (Conversation((AssistantMessage("a", reasoning="r"),)), "reasoning"),
        (Conversation((UserMessage((ImageRef("http://127.0.0.1/a.png"),)),)), "images"),
    ],
)
def test_deepseek_only_features_are_refused(conv, match):
    with pytest.raises(InvalidRequest, match=match):
        plain_messages(conv)


def test_thinking_off_and_default_effort_pass():
    assert plain_messages(Conversation((UserMessage(("x",)),), thinking=False, effort=None)) == [
        {"role": "user", "content": "x"}
    ]
