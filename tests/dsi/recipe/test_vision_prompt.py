"""The V4 prompt of a model with a vision encoder: start, pads, end where the text-only prompt
has its placeholder; a text-only model renders images exactly as before."""

from __future__ import annotations

import json

from dsi.model.vit import TINY_VISION
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.vision_prompt import IMAGE_END_ID, IMAGE_PAD_ID, IMAGE_START_ID, VisionSpec
from tests.images import b64, data_url, png_bytes

VISION = Recipe(models=ModelTable({"m": ServedModel("m", ModelVersion.V4, vision=VisionSpec(TINY_VISION))}))
TEXT = Recipe(models=ModelTable({"m": ServedModel("m", ModelVersion.V4)}))
URL = data_url(png_bytes(100, 60))  # resized to 56 x 112: 8 pads


def chat(parts: list, system: list | None = None) -> dict:
    msgs = [{"role": "system", "content": system}] if system else []
    return {
        "model": "m",
        "thinking": {"type": "disabled"},
        "messages": [*msgs, {"role": "user", "content": parts}],
    }


def test_images_take_the_placeholder_place_in_all_three_protocols():
    bodies = {
        "chat": chat([{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": URL}}]),
        "responses": {
            "model": "m",
            "reasoning": {"effort": "none"},
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": URL},
                    ],
                }
            ],
        },
        "messages": {
            "model": "m",
            "max_tokens": 8,
            "thinking": {"type": "disabled"},
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": b64(png_bytes(100, 60)),
                            },
                        },
                    ],
                }
            ],
        },
    }
    for protocol, body in bodies.items():
        text_only = TEXT.prepare(protocol, body)
        req = VISION.prepare(protocol, body)
        assert req.prompt_text == text_only.prompt_text.replace("[Unsupported Image]", "<｜image｜>"), (
            protocol
        )
        (placed,) = req.placed_images
        ids = req.prompt_token_ids
        assert ids[placed.offset - 1] == IMAGE_START_ID and ids[placed.end] == IMAGE_END_ID
        assert list(ids[placed.offset : placed.end]) == [IMAGE_PAD_ID] * 8
        assert text_only.placed_images == () and IMAGE_PAD_ID not in text_only.prompt_token_ids


def test_images_keep_their_order_when_system_messages_are_lifted():
    other = data_url(png_bytes(28, 28, seed=3))  # one pad
    body = {
        "model": "m",
        "reasoning": {"effort": "none"},
        "input": [
            {"role": "user", "content": [{"type": "input_image", "image_url": URL}]},
            {
                "role": "system",
                "content": [
                    {"type": "input_text", "text": "sys"},
                    {"type": "input_image", "image_url": other},
                ],
            },
        ],
    }
    req = VISION.prepare("responses", body)
    # V4 lifts the system message into the head: its image comes first in the prompt.
    assert [p.image.tokens for p in req.placed_images] == [1, 8]
    assert req.placed_images[0].end < req.placed_images[1].offset


def test_a_text_only_request_to_a_vision_model_prepares_as_to_a_text_only_one():
    parts = [{"type": "text", "text": "hello"}, {"type": "text", "text": "again"}]
    for body in (chat(parts, system="be brief"), {**chat("hi"), "thinking": {"type": "enabled"}}):
        text = json.dumps(body)
        seen, plain = VISION.prepare("chat", text), TEXT.prepare("chat", text)
        assert seen.prompt_token_ids == plain.prompt_token_ids
        assert seen.prompt == plain.prompt and seen.ends_in_thinking == plain.ends_in_thinking
        assert seen.placed_images == ()
