"""Structured output: response formats, strict tool calls and regexes as per-step token masks.

    spec = StructuredSpec.json_schema({...})           # or json_object / for_regex / tool_call
    constraint = default_compiler().constraint(spec)    # per request; cached compile
    constraint.fill_mask(bitmask); constraint.accept(token); constraint.is_done()

The grammar engine is llguidance (chosen by measured mask latency and compile time on the V4
vocabulary: ``python -m dsi.structured.bench_mask``). Names are imported lazily, so that a spec
(``dsi.structured.spec``: msgspec only) can be built without loading torch.
"""

from importlib import import_module
from typing import Any

_HOMES = {
    "AfterThink": "constraint",
    "GrammarCompiler": "compiler",
    "Rejecting": "constraint",
    "SpecError": "spec",
    "StructuredSpec": "spec",
    "TokenConstraint": "constraint",
    "ToolSpec": "spec",
    "apply_bitmask": "mask",
    "bitmask_words": "mask",
    "default_compiler": "compiler",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'dsi.structured' has no attribute {name!r}")
    return getattr(import_module(f"dsi.structured.{_HOMES[name]}"), name)
