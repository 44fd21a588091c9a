"""JSON text exactly as DeepSeek's prompt templates write it.

``json.dumps(value, ensure_ascii=False)`` with ``", "`` and ``": "`` separators. Integers
outside [-2^63, 2^64) are floats, as a 64-bit JSON parser reads them. Floats: V4.1 writes
them as Python's ``repr``; V4 uses the same digits but positional notation down to 1e-5 and
no zero padding in exponents (``0.00005``, ``1.5e-7`` where ``repr`` gives ``5e-05``,
``1.5e-07``).
"""

from __future__ import annotations

import json
from typing import Any

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1


def dumps(value: Any, v4: bool = True) -> str:
    """``value`` (parsed JSON) as template JSON text, with V4 or V4.1 floats."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if _INT_MIN <= value <= _INT_MAX else format_float(float(value), v4)
    if isinstance(value, float):
        return format_float(value, v4)
    if isinstance(value, dict):
        items = (f"{json.dumps(str(k), ensure_ascii=False)}: {dumps(v, v4)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(dumps(v, v4) for v in value) + "]"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def format_float(x: float, v4: bool = True) -> str:
    text = repr(x)
    if not v4 or "e" not in text:
        return text
    mantissa, exp_text = text.split("e")
    exp = int(exp_text)
    if exp == -5:  # repr switches to exponents one decade earlier than the V4 templates do
        sign = "-" if mantissa.startswith("-") else ""
        digits = mantissa.lstrip("-").replace(".", "")
        return f"{sign}0.0000{digits}"
    return f"{mantissa}e{'+' if exp > 0 else '-'}{abs(exp)}"


def loads(text: str) -> Any:
    """Strict JSON (no NaN/Infinity). Raises ValueError."""
    return json.loads(text, parse_constant=_reject_constant)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")
