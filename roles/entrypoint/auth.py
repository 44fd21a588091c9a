"""API keys of the gateway: who may call, in which traffic class, with how many requests at once.

The keys file is TOML, read strictly (an unknown field or a wrong type is an error)::

    [[keys]]
    key = "sk-team-a-..."        # sent as `Authorization: Bearer KEY` or `x-api-key: KEY`
    name = "team-a"              # for logs and metrics
    traffic_class = "agent"      # agent | chatbot: selects the KV cache TTL
    max_concurrency = 32         # requests in flight for this key; more get HTTP 429
    cache_salt = "team-a"        # optional: this key's prompts share KV cache only with each other

Without a keys file the gateway is open, one anonymous key with the default concurrency. With
``http_workers = N`` a key's ``max_concurrency`` holds over all N workers together (see
dsi.roles.entrypoint.key_slots).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Literal

import msgspec

from dsi.roles.entrypoint.key_slots import KeySlots, LocalSlots


class KeyEntry(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    key: str
    name: str
    traffic_class: Literal["agent", "chatbot"] = "chatbot"
    max_concurrency: int = 64
    cache_salt: str = ""  # part of every KV block hash of this key's requests ("" = the shared cache)


class _KeysFile(msgspec.Struct, forbid_unknown_fields=True):
    keys: list[KeyEntry]


@dataclass(slots=True, frozen=True)
class Caller:
    """An authenticated caller: its key's entry and the key's index (its slot column)."""

    entry: KeyEntry
    index: int = 0


class TooManyRequests(Exception):
    pass


@dataclass(slots=True)
class ApiKeys:
    """The keys (``entries``, in file order; open access: one anonymous entry) and the slots that
    count their requests in flight: ``LocalSlots`` for a lone worker, ``SharedSlots`` when the
    role's HTTP workers share the limits (see dsi.roles.entrypoint.key_slots)."""

    entries: tuple[KeyEntry, ...]
    open_access: bool = False
    slots: InitVar[KeySlots | None] = None
    callers: dict[str, Caller] = field(init=False)
    counts: KeySlots = field(init=False)

    def __post_init__(self, slots: KeySlots | None) -> None:
        self.callers = {e.key: Caller(e, i) for i, e in enumerate(self.entries)}
        self.counts = slots if slots is not None else LocalSlots(len(self.entries))

    @classmethod
    def load(cls, path: Path | None, default_concurrency: int = 256) -> ApiKeys:
        if path is None:
            return cls((KeyEntry("", "anonymous", max_concurrency=default_concurrency),), open_access=True)
        try:
            data = msgspec.toml.decode(Path(path).read_bytes(), type=_KeysFile)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise ValueError(f"{path}: {exc}") from None
        bad = [e.name for e in data.keys if not e.key or e.max_concurrency < 1]
        if bad:
            raise ValueError(f"{path}: keys {bad}: key must be non-empty and max_concurrency >= 1")
        return cls(tuple(data.keys))

    def with_slots(self, slots: KeySlots) -> ApiKeys:
        """The same keys, counted in ``slots``."""
        return ApiKeys(self.entries, self.open_access, slots)

    def authenticate(self, authorization: str | None, x_api_key: str | None) -> Caller | None:
        """The caller for the request's headers, or None (HTTP 401)."""
        if self.open_access:
            return self.callers[""]
        token = x_api_key
        if token is None and authorization and authorization.startswith("Bearer "):
            token = authorization.removeprefix("Bearer ").strip()
        return self.callers.get(token) if token else None

    def acquire(self, caller: Caller) -> None:
        """Take a slot of the caller's key; TooManyRequests when its ``max_concurrency`` are in
        flight (over every HTTP worker of the role)."""
        if not self.counts.take(caller.index, caller.entry.max_concurrency):
            raise TooManyRequests(
                f"{caller.entry.name}: {caller.entry.max_concurrency} requests already in flight"
            )

    def release(self, caller: Caller) -> None:
        self.counts.give(caller.index)

    def in_flight(self, caller: Caller) -> int:
        """The caller's key's requests in flight (over every HTTP worker)."""
        return self.counts.held(caller.index)
