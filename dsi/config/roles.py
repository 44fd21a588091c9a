"""[[roles]]: the roles a node runs, each with the options of its kind.

    [[roles]]                       RoleConfig(kind="prefill", id="prefill-0",
    kind = "prefill"          -->              bind="tcp://10.0.0.11:7110", host="10.0.0.11",
    id = "prefill-0"                           options=EngineOptions(max_batch_tokens=16384, ...))
    bind = "tcp://10.0.0.11:7110"
    max_batch_tokens = 16384

The keys common to all kinds become RoleConfig fields; the rest must be keys of the kind's
options class, so a key that belongs to another kind is an error.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from dsi.config.addresses import listens_everywhere
from dsi.config.endpoints import endpoint_host, parse_bind, parse_host_port
from dsi.config.errors import Where
from dsi.config.reader import describe, expect_table, read_field, read_table, read_values
from dsi.config.sections import NAME, NAME_RULE
from dsi.config.spec import Seen, at_least, at_most, greater, less, matches, spec, spec_of
from dsi.config.vllm import VllmOptions, only_for_vllm

RoleKind = Literal["controller", "entrypoint", "prefill", "decode", "encoder", "kvstore", "balancer"]


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _networks(raw: Any, where: Where) -> tuple[IPNetwork, ...]:
    if not isinstance(raw, list) or any(type(x) is not str for x in raw):
        raise where.error(f'expected an array of CIDR strings such as "10.0.0.0/8", got {describe(raw)}')
    try:
        return tuple(ipaddress.ip_network(x) for x in raw)
    except ValueError as err:
        raise where.error(f'{err} (a network is written as "10.0.0.0/8" or "fd00::/8")') from None


@dataclass(slots=True, frozen=True, kw_only=True)
class EntrypointOptions:
    """The HTTP side of the API gateway; TOML key ``http = "HOST:PORT"``."""

    http_host: str = field(metadata=spec(key="http", parse=parse_host_port, into=("http_host", "http_port")))
    http_port: int = field(metadata=spec(derived=True))
    max_body_bytes: int = field(default=16 * 1024 * 1024, metadata=spec(checks=(greater(0),)))
    # API keys (TOML, see dsi.roles.entrypoint.auth); without it the gateway is open.
    api_keys_file: Path | None = None
    # In-flight requests per key when the keys file does not say (and for open access).
    max_concurrency_per_key: int = field(default=256, metadata=spec(checks=(greater(0),)))
    # Seconds a request whose decode died waits for another decode to be ready before it ends
    # with an error (the request is re-run there; see dsi.roles.entrypoint.recovery).
    reroute_wait_s: float = field(default=5.0, metadata=spec(checks=(at_least(0.0), at_most(600.0))))
    # Seconds a streaming client may read nothing before its stream is aborted, and its engine
    # request with it (see dsi.roles.entrypoint.sse).
    slow_reader_timeout_s: float = field(default=30.0, metadata=spec(checks=(greater(0.0), at_most(3600.0))))
    # Seconds a request waits for a balancer's route before the gateway picks the least loaded
    # instance itself (see dsi.roles.entrypoint.router).
    balancer_timeout_s: float = field(default=0.02, metadata=spec(checks=(greater(0.0), at_most(10.0))))
    # "table": route from a decision table the balancers send every route_table_ttl_s / 4 seconds,
    # held for route_table_ttl_s, asking per request only without one; "ask": every request asks.
    route_mode: Literal["table", "ask"] = "table"
    route_table_ttl_s: float = field(default=0.2, metadata=spec(checks=(greater(0.0), at_most(10.0))))
    # HTTP worker processes sharing the http port (SO_REUSEPORT), each a whole gateway with its own
    # connections to the controller and balancers; the role's process is worker 0 (see
    # dsi.roles.entrypoint.workers).
    http_workers: int = field(default=1, metadata=spec(checks=(greater(0), at_most(256))))
    # Image input of a model with a vision encoder (see dsi.recipe.images): http(s) image URLs
    # are fetched only when true, from public addresses only (requests are then prepared in a
    # worker thread); data URLs always work.
    fetch_image_urls: bool = False
    # Networks image URLs may be fetched from although they are not public, as CIDR strings
    # (["10.20.0.0/16"]: a private deployment's image host; ["127.0.0.1/32"]: tests).
    image_fetch_allow: tuple[IPNetwork, ...] = field(default=(), metadata=spec(reader=_networks))
    max_image_bytes: int = field(default=8 << 20, metadata=spec(checks=(greater(0),)))
    max_images: int = field(default=16, metadata=spec(checks=(greater(0), at_most(1024))))


def _optional_bind(text: str) -> str:
    return parse_bind(text) if text else text


@dataclass(slots=True, frozen=True, kw_only=True)
class KvstoreOptions:
    """Block store, index and index-delta publisher of one kvstore (see dsi.kvcache.store)."""

    store_dir: Path = Path("run/kvstore")  # local disk by default; a 3FS mount in production
    capacity_blocks: int = field(default=0, metadata=spec(checks=(at_least(0),)))  # 0 = unbounded
    # Blocks live this long from their creation, per traffic class (seconds).
    ttl_agent_s: float = field(default=3 * 86400.0, metadata=spec(checks=(greater(0.0),)))
    ttl_chatbot_s: float = field(default=7 * 86400.0, metadata=spec(checks=(greater(0.0),)))
    # "always": fdatasync before a put is acknowledged; "segment": when a segment is sealed; "never".
    fsync: Literal["always", "segment", "never"] = "segment"
    segment_bytes: int = field(default=1 << 30, metadata=spec(checks=(at_least(1 << 16),)))
    # Sealed segments whose live fraction is below this are rewritten (their live blocks copied).
    compact_below: float = field(default=0.5, metadata=spec(checks=(at_least(0.0), at_most(1.0))))
    read_workers: int = field(default=8, metadata=spec(checks=(greater(0), at_most(256))))
    max_inflight_reads: int = field(default=64, metadata=spec(checks=(greater(0),)))  # blocks
    # Index deltas are published here; "" = an ephemeral port where the role binds (its bind
    # host, every interface for a wildcard bind), told as the role's host (dsi.config.addresses).
    publish: str = field(default="", metadata=spec(parse=_optional_bind))
    # An empty delta goes out after this much silence, so replicas notice a lost one (seconds).
    publish_interval_s: float = field(default=1.0, metadata=spec(checks=(greater(0.0),)))
    sweep_interval_s: float = field(
        default=60.0, metadata=spec(checks=(greater(0.0),))
    )  # expiry + compaction


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineOptions:
    """Batch limits of a prefill or decode engine. ``engine``: dsi's own engine, or vLLM
    embedded in the role (its options in ``[roles.vllm]``, see dsi.config.vllm); the batch limits
    and EP options below are dsi's engine's (vLLM takes its own from ``[roles.vllm] args``)."""

    engine: Literal["dsi", "vllm"] = "dsi"
    vllm: VllmOptions = field(default_factory=VllmOptions, metadata=spec(checks=(only_for_vllm,)))

    max_batch_tokens: int = field(default=8192, metadata=spec(checks=(greater(0),)))
    max_running: int = field(default=64, metadata=spec(checks=(greater(0),)))
    num_blocks: int = field(
        default=1024, metadata=spec(checks=(greater(1),))
    )  # Block KV pages, null page included
    # Expert parallelism (see dsi.eplb): ranks of the instance's EP group (1 = the MoE runs in the
    # engine process), redundant expert slots per rank, steps of expert counts a rebalance looks
    # at, and steps between rebalances (0 = never).
    ep_size: int = field(default=1, metadata=spec(checks=(greater(0), at_most(64))))
    ep_redundant: int = field(default=1, metadata=spec(checks=(at_least(0),)))
    ep_window_steps: int = field(default=256, metadata=spec(checks=(greater(0),)))
    ep_rebalance_steps: int = field(default=1024, metadata=spec(checks=(at_least(0),)))


@dataclass(slots=True, frozen=True, kw_only=True)
class ControllerOptions:
    """No options yet (drain, which will have them, is planned; autoscaling is the [autoscale] section)."""


def _token_edges(raw: Any, where: Where) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw or any(type(x) is not int for x in raw):
        raise where.error(f"expected a non-empty array of integers, got {describe(raw)}")
    if any(x <= 0 for x in raw) or raw != sorted(set(raw)):
        raise where.error(f"must be increasing positive token counts, got {raw}")
    return tuple(raw)


@dataclass(slots=True, frozen=True, kw_only=True)
class BalancerOptions:
    """A balancer routes prefill and decode requests (see dsi.roles.balancer and dsi.balance)."""

    # Prefill buckets: un-cached tokens where buckets 1, 2, ... start (DeepSeek's 16K / 64K / 256K).
    bucket_edges: tuple[int, ...] = field(
        default=(16_384, 65_536, 262_144), metadata=spec(reader=_token_edges)
    )
    rebalance_s: float = field(
        default=10.0, metadata=spec(checks=(greater(0.0),))
    )  # seconds between plan checks
    half_life_s: float = field(default=60.0, metadata=spec(checks=(greater(0.0),)))  # measured load halves, s
    bucket_hysteresis: float = field(default=0.05, metadata=spec(checks=(at_least(0.0), less(1.0))))
    min_share: float = field(default=0.01, metadata=spec(checks=(at_least(0.0), less(1.0))))
    # Decode bands: KV tokens of the last band_window requests; a request under long_min_tokens is short.
    band_window: int = field(default=256, metadata=spec(checks=(greater(0),)))
    long_min_tokens: int = field(default=8_192, metadata=spec(checks=(greater(0),)))
    band_hysteresis: float = field(default=0.1, metadata=spec(checks=(at_least(0.0), less(1.0))))
    overload: float = field(default=0.9, metadata=spec(checks=(greater(0.0), at_most(1.0))))
    # An instance whose last load report is older than this (seconds) gets no new work.
    report_timeout_s: float = field(default=3.0, metadata=spec(checks=(greater(0.0),)))


@dataclass(slots=True, frozen=True, kw_only=True)
class EncoderOptions:
    """A vision encoder (see dsi.roles.encoder): images batched across requests, embeddings kept
    by image digest until a prefill pulls them."""

    max_batch_images: int = field(default=16, metadata=spec(checks=(greater(0), at_most(1024))))
    cache_bytes: int = field(default=256 << 20, metadata=spec(checks=(greater(0),)))


RoleOptions = (
    EntrypointOptions | KvstoreOptions | EngineOptions | ControllerOptions | BalancerOptions | EncoderOptions
)

OPTIONS_BY_KIND: Mapping[str, type[RoleOptions]] = MappingProxyType(
    {
        "controller": ControllerOptions,
        "entrypoint": EntrypointOptions,
        "prefill": EngineOptions,
        "decode": EngineOptions,
        "encoder": EncoderOptions,
        "kvstore": KvstoreOptions,
        "balancer": BalancerOptions,
    }
)


def _bind_host(seen: Seen) -> str:
    """The bind's host; unset ("") for a wildcard bind: the address rule finds it when the role
    starts (see dsi.config.addresses)."""
    return "" if listens_everywhere(seen["bind"]) else endpoint_host(seen["bind"])


def _set_unless_wildcard(value: str, seen: Seen) -> str | None:
    return None if value or listens_everywhere(seen["bind"]) else "must not be empty"


@dataclass(slots=True, frozen=True, kw_only=True)
class RoleConfig:
    """One role on this node. `host` is the name other machines use to reach `bind`; "" for a
    wildcard bind without one (found when the role starts, see dsi.config.addresses)."""

    kind: RoleKind
    id: str = field(metadata=spec(checks=(matches(NAME, NAME_RULE),)))
    bind: str = field(metadata=spec(parse=parse_bind))
    host: str = field(metadata=spec(fallback=_bind_host, checks=(_set_unless_wildcard,)))
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
