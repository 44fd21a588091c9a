"""Random but valid request bodies for the three protocols, with control-token spellings in
every field the client controls. ``random.Random(seed)`` makes each body reproducible.

Bodies use what deepseek-recipe accepts beyond the specifications too (its effort names, any
``budget_tokens``, ``system``-role Messages, documents, files, long tool names, ...); parts that
only V4 takes (an image in assistant history, an image by file id) appear in V4 bodies only."""

from __future__ import annotations

import json
import random
from typing import Any

MODELS = ("DeepSeek-V4-Pro", "DeepSeek-V4.1-Flash")
MARKERS = (
    "<｜Assistant｜>",
    "<｜User｜>",
    "</think>",
    "<think>",
    "｜DSML｜",
    '<｜DSML｜invoke name="f">',
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜latest_reminder｜>",
    "<｜System｜>",
    "<tool_result>",
    "<｜tool▁calls▁begin｜>",
)
WORDS = ("hello", "中文内容", "naïve café", "  two  spaces  ", "line\nbreak", "emoji 🙂", "json", "x")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "ultra", "max")
IMAGE = "https://example.invalid/cat.png"
DETAILS = ("auto", "low", "high", "original")
V4 = "DeepSeek-V4-Pro"


def tool_name(rng: random.Random, name: str) -> str:
    """``name``, now and then padded to more than OpenAI's 64 characters (deepseek-recipe: 128)."""
    if rng.random() >= 0.1:
        return name
    return name + "_" * rng.randint(64 - len(name), 127 - len(name)) + "x"


def text(rng: random.Random, markers: bool = True) -> str:
    pieces = [rng.choice(WORDS) for _ in range(rng.randint(1, 3))]
    if markers and rng.random() < 0.7:
        pieces.insert(rng.randint(0, len(pieces)), rng.choice(MARKERS))
    return " ".join(pieces)


def arguments(rng: random.Random) -> dict[str, Any]:
    args: dict[str, Any] = {"city": text(rng)}
    if rng.random() < 0.5:
        args["days"] = rng.choice([1, 2.5, -3, 10**20])
    if rng.random() < 0.5:
        args[text(rng, markers=False).strip() or "k"] = {"nested": [text(rng), None, True]}
    return args


def parameters(rng: random.Random, strict: bool) -> dict[str, Any]:
    props: dict[str, Any] = {
        "city": {"type": "string", "description": text(rng)},
        "days": {"type": "number", "description": "how many"},
    }
    if rng.random() < 0.5:
        props["opts"] = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}}}
    schema: dict[str, Any] = {"type": "object", "properties": props}
    if not strict and rng.random() < 0.5:
        schema["required"] = ["city"]
    return schema


def thinking_off(rng: random.Random, body: dict[str, Any], protocol: str) -> None:
    if protocol == "chat":
        body["thinking"] = {"type": "disabled"}
    elif protocol == "responses":
        body["reasoning"] = {"effort": "none"}
    else:
        body["thinking"] = {"type": "disabled"}


# -- Chat Completions ----------------------------------------------------------------------


def chat(rng: random.Random, model: str) -> dict[str, Any]:
    strict = rng.random() < 0.3  # DeepSeek refuses strict and non-strict tools together
    names = [tool_name(rng, n) for n in rng.sample(["get_weather", "search", "calc"], rng.randint(0, 3))]
    tools = [{"type": "function", "function": _chat_tool(rng, name, strict)} for name in names]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": text(rng)} for _ in range(rng.randint(0, 3))]
    call_no = 0
    for turn in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": _chat_user_content(rng, model)})
        if rng.random() < 0.2:
            msgs.append({"role": "latest_reminder", "content": text(rng)})
        if turn == 0 and rng.random() < 0.2:
            msgs.append({"role": "system", "content": text(rng)})
        if rng.random() < 0.3:
            continue  # consecutive user messages
        for _ in range(rng.randint(1, 2)):
            reply: dict[str, Any] = {
                "role": "assistant",
                "content": _chat_assistant_content(rng, model) if rng.random() < 0.8 else None,
            }
            if rng.random() < 0.6:
                reply["reasoning_content"] = text(rng)
            calls = []
            if tools and rng.random() < 0.6:
                for _ in range(rng.randint(1, 3)):
                    call_no += 1
                    calls.append(
                        {
                            "id": f"call_{rng.randint(0, 99)}_{call_no}",
                            "type": "function",
                            "function": {
                                "name": rng.choice(tools)["function"]["name"],
                                "arguments": json.dumps(arguments(rng), ensure_ascii=rng.random() < 0.5),
                            },
                        }
                    )
                reply["tool_calls"] = calls
            if reply["content"] is None and not calls:
                reply["content"] = ""
            msgs.append(reply)
            results = [
                {"role": "tool", "tool_call_id": c["id"], "content": _chat_tool_content(rng)} for c in calls
            ]
            for r in results:
                if rng.random() < 0.2:
                    r["name"] = "get_weather"
            rng.shuffle(results)
            msgs.extend(results)
            if not calls:
                break
    if msgs[-1]["role"] == "assistant" and not tools and rng.random() < 0.7:
        msgs[-1]["prefix"] = True
    elif msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": text(rng)})
    body: dict[str, Any] = {"model": model, "messages": msgs}
    if tools:
        body["tools"] = tools
    _chat_settings(rng, body, tools)
    return body


def _chat_tool(rng: random.Random, name: str, strict: bool) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if rng.random() < 0.8:
        fn["description"] = text(rng)
    if strict or rng.random() < 0.9:
        fn["parameters"] = parameters(rng, strict)
    if strict:
        fn["strict"] = True
    return fn


def _chat_user_content(rng: random.Random, model: str) -> Any:
    if rng.random() < 0.6:
        return text(rng)
    parts: list[dict[str, Any]] = [{"type": "text", "text": text(rng)} for _ in range(rng.randint(1, 3))]
    if rng.random() < 0.3:
        image = {"type": "image_url", "image_url": {"url": IMAGE, "detail": rng.choice(DETAILS)}}
        parts.insert(rng.randint(0, len(parts)), image)
    if model == V4 and rng.random() < 0.15:
        parts.append({"type": "file", "file": {"file_id": "file-1", "filename": "a.pdf"}})
    return parts


def _chat_assistant_content(rng: random.Random, model: str) -> Any:
    if model != V4 or rng.random() < 0.85:
        return text(rng)
    return [{"type": "text", "text": text(rng)}, {"type": "image_url", "image_url": {"url": IMAGE}}]


def _chat_tool_content(rng: random.Random) -> Any:
    if rng.random() < 0.8:
        return text(rng)
    return [{"type": "text", "text": text(rng)}, {"type": "image_url", "image_url": {"url": IMAGE}}]


def _chat_settings(rng: random.Random, body: dict[str, Any], tools: list[Any]) -> None:
    mode = rng.choice(["default", "enabled", "disabled", "effort"])
    if mode in ("enabled", "disabled"):
        body["thinking"] = {"type": mode}
        if rng.random() < 0.3:
            body["thinking"]["budget_tokens"] = rng.choice([0, 1024, 10**6])
    if mode != "disabled" and rng.random() < 0.8:
        body["reasoning_effort"] = rng.choice(EFFORTS)
    off = mode == "disabled" or (body.get("reasoning_effort") == "none" and mode != "enabled")
    choices = ["auto", "none"] + (["required", "named"] if off else [])
    if not tools and rng.random() < 0.05:  # forcing a tool with none declared: auto
        body["tool_choice"] = rng.choice(["required", {"type": "function", "function": {"name": "zz"}}])
    if tools and rng.random() < 0.6:
        choice = rng.choice(choices)
        body["tool_choice"] = (
            {"type": "function", "function": {"name": rng.choice(tools)["function"]["name"]}}
            if choice == "named"
            else choice
        )
    fmt = rng.choice(["none", "none", "text", "json_object", "json_schema", "regex"])
    strict_tools = any(t["function"].get("strict") for t in tools) and body.get("tool_choice") != "none"
    if strict_tools:
        fmt = "none"  # DeepSeek refuses these combinations
    elif body["messages"][-1].get("prefix"):
        fmt = rng.choice(["none", "text"])
    if fmt == "json_object":
        body["messages"].insert(0, {"role": "system", "content": "Answer in JSON " + text(rng)})
        body["response_format"] = {"type": "json_object"}
    elif fmt == "json_schema":
        strict = rng.random() < 0.5
        spec = {"name": "answer", "strict": strict, "schema": parameters(rng, strict)}
        if rng.random() < 0.2:
            del spec["name"]
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    elif fmt == "regex":
        body["response_format"] = {"type": "regex", "regex": rng.choice(["[a-z]+", "(yes|no)", "[0-9]{3}"])}
    elif fmt == "text":
        body["response_format"] = {"type": "text"}
    _common_sampling(rng, body, "max_tokens")
    if rng.random() < 0.3:
        body["stop"] = rng.choice([text(rng), [text(rng), "STOP"]])
    if rng.random() < 0.3:
        body["seed"] = rng.randint(0, 2**40)
    if rng.random() < 0.2:
        body["logprobs"] = True
        body["top_logprobs"] = rng.randint(0, 20)
    if rng.random() < 0.3:
        body["stream"] = True
        body["stream_options"] = {"include_usage": rng.random() < 0.5}


def _common_sampling(rng: random.Random, body: dict[str, Any], max_key: str) -> None:
    if rng.random() < 0.5:
        body[max_key] = rng.randint(1, 4096)
    if rng.random() < 0.5:
        body["temperature"] = rng.choice([0.0, 0.25, 0.7, 1.0])
    if rng.random() < 0.5:
        body["top_p"] = rng.choice([0.125, 0.5, 0.96, 1.0])


# -- Responses -----------------------------------------------------------------------------


def responses(rng: random.Random, model: str) -> dict[str, Any]:
    strict = rng.random() < 0.3
    tools = [
        {"type": "function", **_chat_tool(rng, tool_name(rng, name), strict)}
        for name in rng.sample(["lookup", "fetch"], rng.randint(0, 2))
    ]
    for tool in tools:
        if rng.random() < 0.15:
            tool["defer_loading"] = rng.random() < 0.5
    items: list[dict[str, Any]] = []
    for _ in range(rng.randint(0, 2)):
        items.append({"role": rng.choice(["system", "developer"]), "content": text(rng)})
    call_no = 0
    for _ in range(rng.randint(1, 3)):
        items.append(_responses_user(rng, model))
        if rng.random() < 0.3:
            continue
        for _ in range(rng.choice([1, 1, 1, 2, 3])):  # reasoning after a message opens a new turn
            if rng.random() < 0.6:
                items.append(_responses_reasoning(rng))
            if rng.random() < 0.8:
                items.append(_responses_assistant(rng, model))
            if rng.random() < 0.1:
                items.append(
                    {
                        "type": "web_search_call",
                        "id": "ws_1",
                        "status": "completed",
                        "action": {"type": "search"},
                    }
                )
        if tools and rng.random() < 0.6:
            calls = []
            for _ in range(rng.randint(1, 2)):
                call_no += 1
                calls.append(
                    {
                        "type": "function_call",
                        "call_id": f"fc_{rng.randint(0, 99)}_{call_no}",
                        "name": rng.choice(tools)["name"],
                        "arguments": json.dumps(arguments(rng)),
                    }
                )
            items.extend(calls)
            outs = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": text(rng)} for c in calls
            ]
            rng.shuffle(outs)
            items.extend(outs)
    if (
        items[-1].get("type") in ("message", "reasoning", "web_search_call")
        and items[-1].get("role") != "user"
    ):
        items.append(_responses_user(rng, model))
    body: dict[str, Any] = {"model": model, "input": items}
    if (
        rng.random() < 0.2
        and len(items) == 1
        and "content" in items[0]
        and isinstance(items[0]["content"], str)
    ):
        body["input"] = items[0]["content"]
    if rng.random() < 0.5:
        body["instructions"] = text(rng)
    if tools:
        body["tools"] = tools
    effort = rng.choice((None, *EFFORTS))
    if effort is not None:
        body["reasoning"] = {"effort": effort}
    if tools and rng.random() < 0.6:
        choices = ["auto", "none"] + (["required", "named"] if effort == "none" else [])
        choice = rng.choice(choices)
        body["tool_choice"] = {"type": "function", "name": tools[0]["name"]} if choice == "named" else choice
    if rng.random() < 0.1:  # dropped, as web_search is: the choice is auto
        body.setdefault("tools", []).append({"type": rng.choice(["web_search", "web_search_2025_08_26"])})
        body["tool_choice"] = {"type": rng.choice(["web_search", "web_search_2025_08_26"])}
    fmt = rng.choice(["none", "text", "json_object", "json_schema"])
    if strict and tools and body.get("tool_choice") != "none":
        fmt = rng.choice(["none", "text"])
    if fmt == "json_object":
        body["instructions"] = "Reply with JSON. " + body.get("instructions", "")
        body["text"] = {"format": {"type": "json_object"}}
    elif fmt == "json_schema":
        strict = rng.random() < 0.5
        body["text"] = {
            "format": {
                "type": "json_schema",
                "name": "out",
                "strict": strict,
                "schema": parameters(rng, strict),
            }
        }
    elif fmt == "text":
        body["text"] = {"format": {"type": "text"}}
    _common_sampling(rng, body, "max_output_tokens")
    if rng.random() < 0.3:
        body["stream"] = True
    if rng.random() < 0.1:
        body["stream_options"] = {"include_obfuscation": False}
    if rng.random() < 0.03:  # instructions alone
        body = {k: v for k, v in body.items() if k not in ("input", "tools", "tool_choice", "text")}
        body["instructions"] = text(rng)
    return body


def _responses_user(rng: random.Random, model: str) -> dict[str, Any]:
    if rng.random() < 0.5:
        return {"role": "user", "content": text(rng)}
    parts: list[dict[str, Any]] = [
        {"type": "input_text", "text": text(rng)} for _ in range(rng.randint(1, 2))
    ]
    if rng.random() < 0.3:
        parts.append({"type": "input_image", "image_url": IMAGE, "detail": rng.choice(DETAILS)})
    if rng.random() < 0.1:
        parts.append({"type": "input_file", "file_id": "file-1"})
    if model == V4 and rng.random() < 0.1:
        parts.append({"type": "input_image", "file_id": "file-2"})
    return {"type": "message", "role": "user", "content": parts}


def _responses_reasoning(rng: random.Random) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "reasoning", "id": "rs_1"}
    if rng.random() < 0.7:
        item["summary"] = [{"type": "summary_text", "text": text(rng)}]
    item["content"] = [
        {"type": "reasoning_text", "text": rng.choice([text(rng), ""])} for _ in range(rng.randint(0, 2))
    ]
    return item


def _responses_assistant(rng: random.Random, model: str) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [
        {"type": "output_text", "text": rng.choice([text(rng), text(rng), ""]), "annotations": []}
    ]
    if model == V4 and rng.random() < 0.1:
        parts.append({"type": "input_image", "image_url": IMAGE})
    item = {"type": "message", "role": "assistant", "content": parts}
    if rng.random() < 0.2:
        item["phase"] = rng.choice(["commentary", "final_answer"])
    return item


# -- Messages ------------------------------------------------------------------------------


def messages(rng: random.Random, model: str) -> dict[str, Any]:
    tools = [
        {"name": tool_name(rng, name), "description": text(rng), "input_schema": parameters(rng, False)}
        for name in rng.sample(["read_file", "run"], rng.randint(0, 2))
    ]
    msgs: list[dict[str, Any]] = []
    pending: list[str] = []
    call_no = 0
    for _ in range(rng.randint(1, 3)):
        blocks: list[dict[str, Any]] = [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "content": rng.choice([text(rng), [{"type": "text", "text": text(rng)}]]),
            }
            for i in pending
        ]
        rng.shuffle(blocks)
        blocks += [{"type": "text", "text": text(rng)} for _ in range(rng.randint(0 if blocks else 1, 2))]
        if rng.random() < 0.2:
            blocks.append({"type": "image", "source": _messages_image_source(rng, model)})
        if rng.random() < 0.1:
            blocks.append(_messages_document(rng))
        if not pending and rng.random() < 0.15:  # a system-role turn (V4: in <system-reminder> tags)
            msgs.append(
                {"role": "system", "content": rng.choice([text(rng), [{"type": "text", "text": text(rng)}]])}
            )
        msgs.append(
            {
                "role": "user",
                "content": blocks
                if rng.random() < 0.7 or len(blocks) != 1 or blocks[0]["type"] != "text"
                else blocks[0]["text"],
            }
        )
        pending = []
        if rng.random() < 0.2:
            continue
        reply: list[dict[str, Any]] = []
        if rng.random() < 0.6:
            thought = {"type": "thinking", "thinking": text(rng), "signature": "sig"}
            if rng.random() < 0.2:
                del thought["signature"]
            reply.append(thought)
        if rng.random() < 0.8:
            reply.append({"type": "text", "text": rng.choice([text(rng), text(rng), ""])})
        if model == V4 and rng.random() < 0.1:
            reply.append({"type": "image", "source": {"type": "url", "url": IMAGE}})
        if tools and rng.random() < 0.6:
            for _ in range(rng.randint(1, 2)):
                call_no += 1
                pending.append(f"toolu_{rng.randint(0, 99)}_{call_no}")
                reply.append(
                    {
                        "type": "tool_use",
                        "id": pending[-1],
                        "name": rng.choice(tools)["name"],
                        "input": arguments(rng)
                        if rng.random() < 0.9
                        else rng.choice(["x", [1, 2], 3.5, None]),
                    }
                )
        if not reply:
            reply.append({"type": "text", "text": text(rng)})
        msgs.append({"role": "assistant", "content": reply})
    if msgs[-1]["role"] == "assistant":
        blocks = [{"type": "tool_result", "tool_use_id": i, "content": text(rng)} for i in pending]
        msgs.append({"role": "user", "content": [*blocks, {"type": "text", "text": text(rng)}]})
    body: dict[str, Any] = {"model": model, "max_tokens": rng.randint(1, 4096), "messages": msgs}
    if rng.random() < 0.1:  # deepseek-recipe applies the default
        del body["max_tokens"]
    if rng.random() < 0.6:
        body["system"] = (
            text(rng) if rng.random() < 0.5 else [{"type": "text", "text": text(rng)} for _ in range(2)]
        )
    if tools:
        body["tools"] = tools
    mode = rng.choice(["default", "enabled", "disabled", "adaptive"])
    if mode == "enabled":
        body["max_tokens"] = rng.randint(2048, 8192)
        # deepseek-recipe takes any budget, also one of max_tokens or more
        budget = rng.choice(
            [1024, 0, 500, body["max_tokens"], body["max_tokens"] + rng.randint(1, 10**5), None]
        )
        body["thinking"] = (
            {"type": "enabled"} if budget is None else {"type": "enabled", "budget_tokens": budget}
        )
    elif mode != "default":
        body["thinking"] = {"type": mode}
    if mode != "disabled" and rng.random() < 0.5:
        body["output_config"] = {"effort": rng.choice(EFFORTS[2:])}
    if rng.random() < 0.1:  # constrains the output; not stated in the prompt (deepseek-recipe ignores it)
        body.setdefault("output_config", {})["format"] = {
            "type": "json_schema",
            "schema": parameters(rng, True),
        }
    if tools and rng.random() < 0.6:
        choice = rng.choice(["auto", "none"] + (["tool"] if mode == "disabled" else []))
        body["tool_choice"] = {"type": choice, **({"name": tools[0]["name"]} if choice == "tool" else {})}
    elif not tools and rng.random() < 0.05:  # forcing a tool with none declared: auto
        body["tool_choice"] = rng.choice([{"type": "any"}, {"type": "tool", "name": "zz"}])
    if rng.random() < 0.5:
        body["temperature"] = rng.choice([0.0, 0.5, 1.0, 1.5, 2.0])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.5, 0.99])
    if rng.random() < 0.3:
        body["stop_sequences"] = [text(rng)]
    if rng.random() < 0.3:
        body["stream"] = True
    return body


def _messages_image_source(rng: random.Random, model: str) -> dict[str, Any]:
    kinds = ["url", "url", "base64"] + (["file"] if model == V4 else [])
    kind = rng.choice(kinds)
    if kind == "url":
        return {"type": "url", "url": IMAGE}
    if kind == "file":
        return {"type": "file", "file_id": "file-1"}
    return {
        "type": "base64",
        "media_type": rng.choice(["image/png", "image/jpg", "image/jpeg"]),
        "data": "AAAA",
    }


def _messages_document(rng: random.Random) -> dict[str, Any]:
    """deepseek-recipe writes ``[Unsupported document type: <media type>]`` for a document."""
    return rng.choice(
        [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": text(rng)}},
            {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "AA"}},
            {"type": "document", "source": {"type": "url", "url": "https://example.invalid/a.pdf"}},
            {"type": "document", "title": "t", "source": {"type": "content", "content": text(rng)}},
        ]
    )


GENERATORS = {"chat": chat, "responses": responses, "messages": messages}


# -- V4.1 within the shipped vocabulary -----------------------------------------------------

_SYSTEM_ROLES = ("system", "developer")


def without_system_token(body: dict[str, Any], protocol: str) -> dict[str, Any]:
    """``body`` without what opens a ``<｜System｜>`` block in a V4.1 prompt: thinking off, and no
    system or developer messages, instructions, tools or response format. What is left renders
    with control tokens that the shipped V4 vocabulary has."""
    out = {k: v for k, v in body.items() if k not in _SYSTEM_KEYS[protocol]}
    if protocol == "chat":
        out["messages"] = [m for m in body["messages"] if m["role"] not in _SYSTEM_ROLES]
        out["thinking"] = {"type": "disabled"}
    elif protocol == "responses":
        given = body.get("input", "hi")
        out["input"] = (
            [i for i in given if i.get("role") not in _SYSTEM_ROLES] if isinstance(given, list) else given
        )
        out["reasoning"] = {"effort": "none"}
    else:
        out["messages"] = [m for m in body["messages"] if m["role"] not in _SYSTEM_ROLES]
        out["thinking"] = {"type": "disabled"}
    return out


_SYSTEM_KEYS = {
    "chat": ("tools", "tool_choice", "response_format", "reasoning_effort", "thinking"),
    "responses": ("instructions", "tools", "tool_choice", "text", "reasoning"),
    "messages": ("system", "tools", "tool_choice", "output_config", "thinking"),
}
