"""[[roles]]: the roles a node runs, each with the options of its kind.

    [[roles]]                       RoleConfig(kind="prefill", id="prefill-0",
    kind = "prefill"          -->              bind="tcp://10.0.0.11:7110", host="10.0.0.11",
    id = "prefill-0"                           options=EngineOptions(max_batch_tokens=16384, ...))
    bind = "tcp://10.0.0.11:7110"
    max_batch_tokens = 16384

The keys common to all kinds become RoleConfig fields; the rest must be keys of the kind's
options class (dsi.config.role_options), so a key that belongs to another kind is an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from dsi.config.addresses import listens_everywhere
from dsi.config.endpoints import ENDPOINT_FORMS, endpoint_host, parse_bind
from dsi.config.errors import Where
from dsi.config.reader import describe, expect_table, read_field, read_table, read_values
from dsi.config.role_options import OPTIONS_BY_KIND, RoleOptions
from dsi.config.sections import NAME, NAME_RULE
from dsi.config.spec import Seen, matches, rule, spec, spec_of

RoleKind = Literal["controller", "entrypoint", "prefill", "decode", "encoder", "kvstore", "balancer"]


@rule("the bind's host")
def _bind_host(seen: Seen) -> str:
    """The bind's host; unset ("") for a wildcard bind: the address rule finds it when the role
    starts (see dsi.config.addresses)."""
    return "" if listens_everywhere(seen["bind"]) else endpoint_host(seen["bind"])


@rule("not empty unless bind is a wildcard")
def _set_unless_wildcard(value: str, seen: Seen) -> str | None:
    return None if value or listens_everywhere(seen["bind"]) else "must not be empty"


@dataclass(slots=True, frozen=True, kw_only=True)
class RoleConfig:
    """One role on this node. `host` is the name other machines use to reach `bind`; "" for a
    wildcard bind without one (found when the role starts, see dsi.config.addresses)."""

    kind: RoleKind = field(metadata=spec(doc="What the role does; it decides the role's other keys."))
    id: str = field(
        metadata=spec(
            doc="The role's id, unique among the roles of this file.", checks=(matches(NAME, NAME_RULE),)
        )
    )
    bind: str = field(
        metadata=spec(
            doc="ZeroMQ endpoint the role listens on.",
            parse=rule(f"{ENDPOINT_FORMS}; the host may be a wildcard (*, 0.0.0.0, [::])")(parse_bind),
        )
    )
    host: str = field(
        metadata=spec(
            doc="The name other machines reach the role by (for a wildcard bind without one, found when "
            "the role starts; see dsi.config.addresses).",
            fallback=_bind_host,
            checks=(_set_unless_wildcard,),
        )
    )
    options: RoleOptions = field(metadata=spec(internal=True))


def read_roles(raw: Any, where: Where) -> tuple[RoleConfig, ...]:
    """The [[roles]] array: each entry read, then ids and bind addresses checked for clashes."""
    if not isinstance(raw, list):
        raise where.error(f"expected an array of tables ([[roles]]), got {describe(raw)}")
    if not raw:
        raise where.error("at least one [[roles]] entry is required")
    roles = tuple(read_role(entry, where.item(i)) for i, entry in enumerate(raw))
    _reject_duplicate(roles, where, "id", "duplicate role id")
    _reject_duplicate(roles, where, "bind", "duplicate bind address")
    return roles


def read_role(raw: Any, where: Where) -> RoleConfig:
    table = expect_table(raw, where)
    # The kind decides which other keys are allowed, so it is read (and checked) first.
    kind_field = next(f for f in fields(RoleConfig) if f.name == "kind")
    kind = read_field(kind_field, RoleKind, table, where, {})
    options_cls = OPTIONS_BY_KIND[kind]
    option_keys = {spec_of(f).toml_key(f.name) for f in fields(options_cls) if spec_of(f).in_toml}
    values = read_values(RoleConfig, table, where, extra_keys=option_keys)
    options = read_table(options_cls, {k: v for k, v in table.items() if k in option_keys}, where)
    return RoleConfig(**values, options=options)


def _reject_duplicate(roles: tuple[RoleConfig, ...], where: Where, name: str, what: str) -> None:
    first: dict[str, int] = {}
    for i, role in enumerate(roles):
        value = getattr(role, name)
        if value in first:
            also = where.item(first[value]).at(name).key
            raise where.item(i).at(name).error(f"{what} {value!r} (also {also})")
        first[value] = i
