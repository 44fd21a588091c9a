"""Images through the disaggregated cluster: entrypoint -> encoder -> prefill -> decode.

One cluster (controller, entrypoint, encoder, kvstore, one prefill, one decode) serves:
- an OpenAI SDK request with an image_url data URL and an Anthropic SDK request with a base64
  image block, each answered exactly as the same request run in-process (recipe, the ViT on the
  decoded image, one engine);
- the same image again: the prefix hit reaches past the image; a different image with the same
  text: the hit stops before the image;
- twelve malformed images, each a 400 in the protocol's shape, and the cluster still serves.
"""

from __future__ import annotations

import asyncio
import json
import random
import re

import aiohttp
import anthropic
import openai
import pytest

from dsi.engine.engine import Engine, EngineConfig
from dsi.engine.images import ImageEmbeds
from dsi.engine.params import EOS_ID
from dsi.model.config import get_config
from dsi.model.prepare import ensure_model, ensure_vision
from dsi.model.vit import TINY_VISION, encode_images, image_tensor, load_vision
from dsi.model.weights import load_model
from dsi.recipe import ModelVersion, Recipe
from dsi.recipe.emit_stream import OutputStream
from dsi.recipe.models import ServedModel
from dsi.recipe.vision_prompt import VisionSpec
from dsi.roles.entrypoint.prepare import Preparer
from tests.dsi.cli.procs import SHARED_MODEL_DIR
from tests.images import b64, data_url, malformed_urls, png_bytes
from tests.roles.cluster import Cluster, cluster_config
from tests.roles.test_prefix_cache_cluster import wait_blocks

pytestmark = [pytest.mark.slow, pytest.mark.concurrent]

ROLES = ("controller-0", "entrypoint-0", "encoder-0", "kvstore-0", "prefill-0", "decode-0")
MAX_TOKENS = 8
WORDS = ("alpha", "ledger", "river", "orbit", "tensor", "harbor", "garden", "spice")


def text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def chat_body(image: bytes) -> dict:
    return {
        "model": "dsi-tiny",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "thinking": {"type": "disabled"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": text(1, 300)},
                    {"type": "image_url", "image_url": {"url": data_url(image)}},
                    {"type": "text", "text": text(2, 200)},
                ],
            }
        ],
    }


def messages_body(image: bytes) -> dict:
    return {
        "model": "dsi-tiny",
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "thinking": {"type": "disabled"},
        "messages": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": b64(image)},
                    },
                    {"type": "text", "text": text(3, 40)},
                ],
            }
        ],
    }


def preparer() -> Preparer:
    served = ServedModel("dsi-tiny", ModelVersion.V4, vision=VisionSpec(TINY_VISION))
    return Preparer(Recipe({"dsi-tiny": served}), get_config("tiny").max_context)


def in_process(requests: list[tuple[str, dict]]) -> list[dict]:
    """The response bodies of ``requests`` (protocol, body) run in this process: recipe, ViT on
    the decoded images, one engine (greedy)."""
    directory = ensure_model(SHARED_MODEL_DIR, "tiny")
    ensure_vision(directory, "tiny")
    vcfg, vw = load_vision(directory)
    cfg, w = load_model(directory)
    engine = Engine(cfg, w, EngineConfig(async_scheduling=False, num_blocks=32, num_slots=4, max_running=4))
    preps = [preparer()(protocol, json.dumps(body).encode(), "chatbot") for protocol, body in requests]
    for i, prep in enumerate(preps):
        embeds = encode_images(vcfg, vw, [image_tensor(p.image.array()) for p in prep.images])
        images = [ImageEmbeds(p.offset, e, p.image.digest) for p, e in zip(prep.images, embeds, strict=True)]
        engine.add_request(str(i), prep.token_ids, prep.sampling, images=images)
    done = {o.request_id: o.output for o in engine.run_until_done() if o.finished}
    engine.close()
    bodies = []
    for i, prep in enumerate(preps):
        ids = done[str(i)]
        out = OutputStream(prep.options)
        out.feed(ids)
        out.finish("length" if len(ids) == MAX_TOKENS and ids[-1] != EOS_ID else "stop")
        bodies.append(out.body())
    return bodies


def image_span(body: dict) -> tuple[int, int]:
    prep = preparer()("chat", json.dumps(body).encode(), "chatbot")
    return prep.images[0].offset, prep.images[0].end


async def test_images_through_the_cluster(procs, tmp_path):
    config = cluster_config(tmp_path, keep=ROLES)
    http = re.search(r'http = "([^"]+)"', config.read_text()).group(1)  # type: ignore[union-attr]
    cluster = Cluster(config, procs)
    cluster.start()
    base = f"http://{http}/v1"
    first, other = png_bytes(224, 224, seed=1), png_bytes(224, 224, seed=2)
    expected_chat, expected_messages = in_process(
        [("chat", chat_body(first)), ("messages", messages_body(other))]
    )
    oai = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0)
    ant = anthropic.AsyncAnthropic(base_url=f"http://{http}", api_key="none", max_retries=0)
    async with aiohttp.ClientSession() as session:
        for _ in range(150):  # the gateway learns the encoder, prefill and decode by heartbeat
            async with session.post(f"{base}/chat/completions", json=chat_body(first)) as resp:
                if resp.status == 200:
                    warm = await resp.json()
                    break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"no answer: {resp.status} {await resp.text()}")
        assert warm["choices"][0]["message"]["content"] == expected_chat["choices"][0]["message"]["content"]

        # The SDKs, against the in-process run.
        body = chat_body(first)
        got = await oai.chat.completions.create(
            model="dsi-tiny",
            messages=body["messages"],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"thinking": {"type": "disabled"}},
        )
        mb = messages_body(other)
        msg = await ant.messages.create(
            model="dsi-tiny",
            max_tokens=MAX_TOKENS,
            messages=mb["messages"],
            extra_body={"temperature": 0, "thinking": {"type": "disabled"}},
        )
        assert [b.text for b in msg.content if b.type == "text"] == [
            b["text"] for b in expected_messages["content"] if b["type"] == "text"
        ]
        assert (
            msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0) > 16
        )  # the image's tokens count

        # Prefix hits: the same image reaches past it, a different image stops before it.
        offset, end = image_span(body)
        past = -(-end // 128) * 128  # the first block boundary past the image
        await wait_blocks(cluster, past // 128)
        usage = got.usage  # the SDK request ran after the warm-up one: it may already hit
        for _ in range(50):
            async with session.post(f"{base}/chat/completions", json=chat_body(first)) as resp:
                again = await resp.json()
            if again["usage"]["prompt_tokens_details"]["cached_tokens"] >= past:
                break
            await asyncio.sleep(0.2)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= past
        async with session.post(f"{base}/chat/completions", json=chat_body(other)) as resp:
            different = await resp.json()
        assert 0 < different["usage"]["prompt_tokens_details"]["cached_tokens"] <= offset // 128 * 128
        assert usage.prompt_tokens == again["usage"]["prompt_tokens"]

        # Twelve malformed images: each a 400 in the protocol's shape; the cluster keeps serving.
        for name, url in malformed_urls().items():
            bad = chat_body(first)
            bad["messages"][0]["content"][1]["image_url"]["url"] = url
            async with session.post(f"{base}/chat/completions", json=bad) as resp:
                err = await resp.json()
                assert resp.status == 400, (name, err)
                assert err["error"]["code"] == "invalid_image", (name, err)
        with pytest.raises(anthropic.BadRequestError) as refused:
            await ant.messages.create(
                model="dsi-tiny",
                max_tokens=MAX_TOKENS,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                            }
                        ],
                    }
                ],
            )
        assert refused.value.body["type"] == "error"
        resp = await oai.chat.completions.create(
            model="dsi-tiny",
            messages=body["messages"],
            max_tokens=MAX_TOKENS,
            temperature=0,
            extra_body={"thinking": {"type": "disabled"}},
        )
        assert (
            resp.choices[0].message.content == expected_chat["choices"][0]["message"]["content"]
            or resp.usage.prompt_tokens_details.cached_tokens
        )
    await oai.close()
    await ant.close()
