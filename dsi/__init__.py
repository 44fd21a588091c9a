"""dsi: disaggregated serving for DeepSeek-V4-family models.

``dsi.LLM`` is the offline entry point; it is imported lazily so that ``import dsi`` (every
role, every CLI command) does not pay for torch until it needs the engine.
"""

from typing import Any

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name == "LLM":
        from dsi.llm import LLM

        return LLM
    if name == "SamplingParams":
        from dsi.engine.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'dsi' has no attribute {name!r}")
