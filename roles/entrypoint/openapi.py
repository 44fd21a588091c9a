"""The OpenAPI document the gateway serves at /openapi.json (request shapes, loosely typed:
the recipe is the strict validator)."""

from __future__ import annotations

from typing import Any

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string"},
        "content": {},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"},
        "reasoning_content": {"type": "string"},
    },
}
_TOOL = {
    "type": "object",
    "properties": {
        "type": {"type": "string"},
        "function": {"type": "object"},
        "name": {"type": "string"},
        "input_schema": {"type": "object"},
    },
}
_COMMON = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "tools": {"type": "array", "items": _TOOL},
    "tool_choice": {},
}


def _post(summary: str, required: list[str], props: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "properties": {**_COMMON, **props}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {"description": "the completion (JSON, or an SSE stream when stream is true)"},
                "400": {"description": "invalid request"},
                "401": {"description": "missing or invalid API key"},
                "429": {"description": "too many requests in flight for this key"},
            },
        }
    }


def openapi_document(models: list[str]) -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "dsi gateway",
            "version": "1",
            "description": f"served models: {', '.join(models)}",
        },
        "paths": {
            "/v1/chat/completions": _post(
                "OpenAI Chat Completions",
                ["model", "messages"],
                {
                    "messages": {"type": "array", "items": _MESSAGE},
                    "max_tokens": {"type": "integer"},
                    "max_completion_tokens": {"type": "integer"},
                    "n": {"type": "integer"},
                    "stop": {},
                    "seed": {"type": "integer"},
                    "response_format": {"type": "object"},
                    "stream_options": {"type": "object"},
                    "reasoning_effort": {"type": "string"},
                    "logprobs": {"type": "boolean"},
                    "top_logprobs": {"type": "integer"},
                    "frequency_penalty": {"type": "number"},
                    "presence_penalty": {"type": "number"},
                    "ignore_eos": {"type": "boolean", "description": "extension: generate past EOS"},
                },
            ),
            "/v1/responses": _post(
                "OpenAI Responses",
                ["model", "input"],
                {
                    "input": {},
                    "instructions": {"type": "string"},
                    "max_output_tokens": {"type": "integer"},
                    "reasoning": {"type": "object"},
                    "text": {"type": "object"},
                    "include": {"type": "array", "items": {"type": "string"}},
                    "top_logprobs": {"type": "integer"},
                    "ignore_eos": {"type": "boolean", "description": "extension: generate past EOS"},
                },
            ),
            "/v1/messages": _post(
                "Anthropic Messages",
                ["model", "messages", "max_tokens"],
                {
                    "messages": {"type": "array", "items": _MESSAGE},
                    "system": {},
                    "max_tokens": {"type": "integer"},
                    "stop_sequences": {"type": "array", "items": {"type": "string"}},
                    "thinking": {"type": "object"},
                    "top_k": {"type": "integer"},
                    "metadata": {
                        "type": "object",
                        "description": "also dsi's hit_policy and ignore_eos (a boolean: generate past EOS)",
                    },
                },
            ),
            "/v1/models": {
                "get": {"summary": "served models", "responses": {"200": {"description": "model list"}}}
            },
            "/health": {
                "get": {
                    "summary": "whether a request can be served",
                    "responses": {
                        "200": {"description": "ok"},
                        "503": {"description": "no serving decode instance"},
                    },
                }
            },
        },
    }
