"""API keys of the gateway: who may call, in which traffic class, with how many requests at once.

The keys file is TOML, read strictly (an unknown field or a wrong type is an error)::

    [[keys]]
    key = "sk-team-a-..."        # sent as `Authorization: Bearer KEY` or `x-api-key: KEY`
    name = "team-a"              # for logs and metrics
    traffic_class = "agent"      # agent | chatbot: selects the KV cache TTL
    max_concurrency = 32         # requests in flight for this key; more get HTTP 429
    cache_salt = "team-a"        # optional: this key's prompts share KV cache only with each other

Without a keys file the gateway is open, one anonymous key with the default concurrency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import msgspec


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    key: str
    name: str
    traffic_class: Literal["agent", "chatbot"] = "chatbot"
    max_concurrency: int = 64
    cache_salt: str = ""  # part of every KV block hash of this key's requests ("" = the shared cache)


class _KeysFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[KeyEntry]


@dataclass(slots=True)
class Caller:
    """An authenticated caller and its in-flight count."""

    entry: KeyEntry
    in_flight: int = 0


class TooManyRequests(Exception):
    pass


@dataclass(slots=True)
class ApiKeys:
    callers: dict[str, Caller] = field(default_factory=dict)
    open_access: Caller | None = None

    @classmethod
    def load(cls, path: Path | None, default_concurrency: int = 256) -> ApiKeys:
        if path is None:
            return cls(open_access=Caller(KeyEntry("", "anonymous", max_concurrency=default_concurrency)))
        try:
            data = msgspec.toml.decode(Path(path).read_bytes(), type=_KeysFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        bad = [e.name for e in data.keys if not e.key or e.max_concurrency < 1]
        if bad:
            raise ValueError(f"{path}: keys {bad}: key must be non-empty and max_concurrency >= 1")
        return cls({e.key: Caller(e) for e in data.keys})

    def authenticate(self, authorization: str | None, x_api_key: str | None) -> Caller | None:
        """The caller for the request's headers, or None (HTTP 401)."""
        if self.open_access is not None:
            return self.open_access
        token = x_api_key
        if token is None and authorization and authorization.startswith("Bearer "):
            token = authorization.removeprefix("Bearer ").strip()
        return self.callers.get(token) if token else None

    @staticmethod
    def acquire(caller: Caller) -> None:
        if caller.in_flight >= caller.entry.max_concurrency:
            raise TooManyRequests(
                f"{caller.entry.name}: {caller.entry.max_concurrency} requests already in flight"
            )
        caller.in_flight += 1

    @staticmethod
    def release(caller: Caller) -> None:
        caller.in_flight -= 1
