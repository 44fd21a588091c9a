"""The one place where TOML values meet config dataclasses: keys, types, defaults and checks.

    table (dict from tomllib) --read_values(cls)--> {field name: value} --cls(**values)--> config

For each field of `cls`, in declaration order: take the value under its TOML key, check its type
against the field's annotation, parse it, run the spec's checks; or, when the key is absent, use
the spec's fallback or the field's default, or report the missing key. Keys of the table that no
field claims are errors. Every error names the file and the dotted key.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterable
from dataclasses import MISSING, Field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from dsi.config.errors import Where
from dsi.config.spec import Seen, Spec, spec_of

T = TypeVar("T")

_NAMES: dict[type, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "a table",
}


def describe(value: Any) -> str:
    """The TOML kind of a value, for error messages: 'a string', 'an integer', ..."""
    return _NAMES.get(type(value), type(value).__name__)


def expect_table(raw: Any, where: Where) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise where.error(f"expected a table, got {describe(raw)}")
    return raw


def read_table(cls: type[T], raw: Any, where: Where, **given: Any) -> T:
    """An instance of the config dataclass `cls` read from the TOML table `raw`.

    `given` supplies the fields marked internal (values that do not come from this table).
    """
    return cls(**read_values(cls, raw, where, given=given))


def read_values(
    cls: type, raw: Any, where: Where, *, given: Seen | None = None, extra_keys: Iterable[str] = ()
) -> dict[str, Any]:
    """The field values of `cls` read from `raw`, without constructing `cls`.

    extra_keys: keys of `raw` that another reader owns; they are allowed here but not read.
    """
    table = expect_table(raw, where)
    _reject_unknown(cls, table, where, set(extra_keys))
    hints = get_type_hints(cls)
    values: dict[str, Any] = dict(given or {})
    for f in fields(cls):
        spec = spec_of(f)
        if not spec.in_toml:
            continue
        value = read_field(f, hints[f.name], table, where, values)
        if spec.into:
            values.update(zip(spec.into, value, strict=True))
        else:
            values[f.name] = value
    return values


def read_field(f: Field[Any], hint: Any, table: dict[str, Any], where: Where, seen: Seen) -> Any:
    """The value of one field: from the table, a fallback or its default; checked either way."""
    spec = spec_of(f)
    key = spec.toml_key(f.name)
    here = where.at(key)
    value = _convert(hint, spec, table[key], here) if key in table else _absent(f, hint, spec, here, seen)
    for check in spec.checks:
        reason = check(value, seen)
        if reason is not None:
            raise here.error(reason)
    return value


def _reject_unknown(cls: type, table: dict[str, Any], where: Where, extra: set[str]) -> None:
    allowed = {spec_of(f).toml_key(f.name) for f in fields(cls) if spec_of(f).in_toml} | extra
    for key in table:
        if key not in allowed:
            raise where.at(key).error(f"unknown key; allowed keys: {', '.join(sorted(allowed))}")


def _absent(f: Field[Any], hint: Any, spec: Spec, here: Where, seen: Seen) -> Any:
    if spec.requires is not None and (why := spec.requires(seen)) is not None:
        raise here.error(f"missing required key ({why})")
    if spec.fallback is not None:
        try:
            return spec.fallback(seen)
        except ValueError as err:
            raise here.error(str(err)) from None
    if f.default is MISSING and f.default_factory is MISSING:
        raise here.error("missing required key")
    hint = without_none(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        return read_table(hint, {}, here)  # an absent section: every key at its default
    value = f.default if f.default is not MISSING else f.default_factory()
    return here.resolve(value) if isinstance(value, Path) else value


def _convert(hint: Any, spec: Spec, raw: Any, here: Where) -> Any:
    if spec.reader is not None:
        return spec.reader(raw, here)
    hint = without_none(hint)
    if isinstance(hint, type) and is_dataclass(hint):
        return read_table(hint, raw, here)
    value = _typed(hint, raw, here)
    if spec.parse is None:
        return value
    try:
        return spec.parse(value)
    except ValueError as err:
        raise here.error(str(err)) from None


def _typed(hint: Any, raw: Any, here: Where) -> Any:
    """`raw` checked against the annotation `hint` (bool is never an int; an int is a float)."""
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        if raw not in choices or type(raw) is not type(choices[0]):
            allowed = ", ".join(repr(c) for c in choices)
            raise here.error(f"must be one of {allowed}; got {raw!r}")
        return raw
    if hint is float:
        if type(raw) is int:
            raw = float(raw)
        if type(raw) is float and not math.isfinite(raw):
            raise here.error(f"must be a finite number, got {raw}")
    if hint is Path:
        if type(raw) is not str:
            raise here.error(f"expected a path string, got {describe(raw)}")
        if not raw:
            raise here.error("a path must not be empty")
        return here.resolve(Path(raw))
    if type(raw) is not hint:
        raise here.error(f"expected {_NAMES.get(hint, hint)}, got {describe(raw)}")
    return raw


def without_none(hint: Any) -> Any:
    """`X` for an `X | None` annotation (TOML has no null: an absent key is the None)."""
    if get_origin(hint) in (Union, types.UnionType):
        rest = [arg for arg in get_args(hint) if arg is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return hint
