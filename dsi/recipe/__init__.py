"""The recipe, input side: protocol request bodies (OpenAI Chat Completions, OpenAI Responses,
Anthropic Messages) -> one Conversation -> V4 / V4.1 prompt segments -> token ids, with
sampling settings resolved as DeepSeek's API resolves them.

    recipe = Recipe({"dsi-tiny": ModelVersion.V4})
    try:
        req = recipe.prepare("chat", body)        # ResolvedRequest
    except RequestError as err:
        status, payload = err.status, error_body(err, "chat")
"""

from dsi.recipe.conversation import Conversation, ModelVersion
from dsi.recipe.errors import Protocol, RequestError, error_body
from dsi.recipe.models import ModelTable, ServedModel
from dsi.recipe.recipe import Recipe
from dsi.recipe.render import render
from dsi.recipe.resolve import RequestPrompt, ResolvedRequest

__all__ = [
    "Conversation",
    "ModelTable",
    "ModelVersion",
    "Protocol",
    "Recipe",
    "RequestError",
    "RequestPrompt",
    "ResolvedRequest",
    "ServedModel",
    "error_body",
    "render",
]
