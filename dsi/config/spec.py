"""Field specs: what the reader needs to know about a config field beyond its type annotation.

A config dataclass declares each field with its type and, where a plain default is not enough,
``field(default=..., metadata=spec(...))``. The type says what TOML value is accepted
(``Literal[...]`` gives the allowed strings, ``Path`` is resolved against the file's directory,
a dataclass is a nested table); the spec adds a one-line description, range checks, parsers and
the few keys whose TOML name or presence differ. Checks, and the fallbacks and requirements of
plain keys, are Rules: functions that carry the words ``dsi config docs`` shows for them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass
from pathlib import Path
from typing import Any

from dsi.config.errors import Where

Seen = Mapping[str, Any]
"""The values read so far from the same table, by field name (fields are read in order)."""

Check = Callable[[Any, Seen], "str | None"]
"""Returns why a value is not acceptable, or None when it is."""

_META = "dsi.config"


@dataclass(slots=True, frozen=True)
class Spec:
    """How one dataclass field is read from its TOML table.

    doc:      what the key sets, in one line (``dsi config docs`` shows it; every key has one).
    key:      the TOML key when it differs from the field name.
    checks:   run in order on the read value (defaults included, so cross-field rules hold).
    parse:    turns the type-checked TOML value into the field value; raises ValueError(reason).
    into:     the parsed value is a tuple that fills these fields (one key, several fields);
              the TOML value is type-checked against this field's own annotation.
    derived:  filled by another field's `into`; not a TOML key.
    internal: supplied by the caller of the reader; not a TOML key.
    fallback: computes the value when the key is absent; raises ValueError(reason).
    requires: says why an absent key is required given the values seen, or None if it is not.
    reader:   reads the raw TOML value itself (type checks included), for tables of tables.
    """

    doc: str = ""
    key: str | None = None
    checks: tuple[Check, ...] = ()
    parse: Callable[[Any], Any] | None = None
    into: tuple[str, ...] = ()
    derived: bool = False
    internal: bool = False
    fallback: Callable[[Seen], Any] | None = None
    requires: Callable[[Seen], str | None] | None = None
    reader: Callable[[Any, Where], Any] | None = None

    def toml_key(self, name: str) -> str:
        return self.key or name

    @property
    def in_toml(self) -> bool:
        return not (self.derived or self.internal)


@dataclass(slots=True, frozen=True)
class Rule:
    """A check, fallback or requirement together with the words the docs show for it
    (``> 0``, ``the bind's host``); calling it calls `fn`."""

    text: str
    fn: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def rule(text: str) -> Callable[[Callable[..., Any]], Rule]:
    """Decorator: ``@rule("not empty")`` above a check makes it a Rule that says so."""
    return lambda fn: Rule(text, fn)


def spec(**kwargs: Any) -> Mapping[str, Spec]:
    """Field metadata carrying a Spec: ``field(default=1.0, metadata=spec(checks=(greater(0),)))``.

    A field with neither default nor default_factory is a required key.
    """
    return {_META: Spec(**kwargs)}


def spec_of(f: Field[Any]) -> Spec:
    return f.metadata.get(_META) or Spec()


def greater(bound: float) -> Check:
    @rule(f"> {bound}")
    def check(value: Any, _: Seen) -> str | None:
        return None if value > bound else f"must be > {bound}, got {value}"

    return check


def at_least(bound: float) -> Check:
    @rule(f">= {bound}")
    def check(value: Any, _: Seen) -> str | None:
        return None if value >= bound else f"must be >= {bound}, got {value}"

    return check


def at_most(bound: float) -> Check:
    @rule(f"<= {bound}")
    def check(value: Any, _: Seen) -> str | None:
        return None if value <= bound else f"must be <= {bound}, got {value}"

    return check


def less(bound: float) -> Check:
    @rule(f"< {bound}")
    def check(value: Any, _: Seen) -> str | None:
        return None if value < bound else f"must be < {bound}, got {value}"

    return check


def greater_than_key(name: str) -> Check:
    """The value must exceed the field `name` of the same table, read before this one."""

    @rule(f"> {name}")
    def check(value: Any, seen: Seen) -> str | None:
        other = seen[name]
        return None if value > other else f"must be > {name} ({other}), got {value}"

    return check


def matches(pattern: str, what: str) -> Check:
    compiled = re.compile(pattern)

    @rule(what)
    def check(value: Any, _: Seen) -> str | None:
        return None if compiled.fullmatch(value) else f"must be {what}, got {value!r}"

    return check


@rule("not empty")
def nonempty(value: Any, _: Seen) -> str | None:
    return None if value else "must not be empty"


def exists_when(flag: str, kind: str) -> Check:
    """A Path (or None) that must name an existing `kind` ("file" or "directory") when `flag` is set."""

    @rule(f"an existing {kind} when {flag} = true")
    def check(value: Path | None, seen: Seen) -> str | None:
        if value is None or not seen[flag]:
            return None
        found = value.is_file() if kind == "file" else value.is_dir()
        return None if found else f"{kind} not found: {value} (needed because {flag} = true)"

    return check


def required_when(flag: str) -> Callable[[Seen], str | None]:
    @rule(f"required when {flag} = true")
    def requires(seen: Seen) -> str | None:
        return f"required when {flag} = true" if seen[flag] else None

    return requires
