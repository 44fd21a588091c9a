"""The options of each role kind: the keys of a [[roles]] entry beyond the common ones
(dsi.config.roles reads an entry's kind first, then these keys with the kind's class).

    [[roles]]
    kind = "entrypoint"         common: kind, id, bind, host (RoleConfig)
    id = "entrypoint-0"
    bind = "tcp://10.0.0.2:7101"
    http = "0.0.0.0:8000"       EntrypointOptions(http_host="0.0.0.0", http_port=8000, ...)
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from dsi.config.endpoints import ENDPOINT_FORMS, parse_bind, parse_host_port
from dsi.config.errors import Where
from dsi.config.reader import describe
from dsi.config.spec import at_least, at_most, greater, less, rule, spec
from dsi.config.vllm import VllmOptions, only_for_vllm

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@rule('CIDR networks such as "10.0.0.0/8" or "fd00::/8"')
def _networks(raw: Any, where: Where) -> tuple[IPNetwork, ...]:
    if not isinstance(raw, list) or any(type(x) is not str for x in raw):
        raise where.error(f'expected an array of CIDR strings such as "10.0.0.0/8", got {describe(raw)}')
    try:
        return tuple(ipaddress.ip_network(x) for x in raw)
    except ValueError as err:
        raise where.error(f'{err} (a network is written as "10.0.0.0/8" or "fd00::/8")') from None


@dataclass(slots=True, frozen=True, kw_only=True)
class EntrypointOptions:
    """The HTTP side of the API gateway."""

    http_host: str = field(
        metadata=spec(
            doc="Where the HTTP API listens (a wildcard host listens on every interface).",
            key="http",
            parse=rule("HOST:PORT")(parse_host_port),
            into=("http_host", "http_port"),
        )
    )
    http_port: int = field(metadata=spec(derived=True))
    max_body_bytes: int = field(
        default=16 * 1024 * 1024,
        metadata=spec(doc="The largest request body accepted, in bytes.", checks=(greater(0),)),
    )
    api_keys_file: Path | None = field(
        default=None,
        metadata=spec(doc="API keys (TOML, see dsi.roles.entrypoint.auth); without it the gateway is open."),
    )
    max_concurrency_per_key: int = field(
        default=256,
        metadata=spec(
            doc="In-flight requests per key when the keys file does not say (and for open access).",
            checks=(greater(0),),
        ),
    )
    reroute_wait_s: float = field(
        default=5.0,
        metadata=spec(
            doc="Seconds a request whose decode died waits for another decode to be ready, where it is "
            "re-run, before it ends with an error (see dsi.roles.entrypoint.recovery).",
            checks=(at_least(0.0), at_most(600.0)),
        ),
    )
    slow_reader_timeout_s: float = field(
        default=30.0,
        metadata=spec(
            doc="Seconds a streaming client may read nothing before its stream is aborted, and its "
            "engine request with it (see dsi.roles.entrypoint.sse).",
            checks=(greater(0.0), at_most(3600.0)),
        ),
    )
    balancer_timeout_s: float = field(
        default=0.02,
        metadata=spec(
            doc="Seconds a request waits for a balancer's route before the gateway picks the least "
            "loaded instance itself (see dsi.roles.entrypoint.router).",
            checks=(greater(0.0), at_most(10.0)),
        ),
    )
    route_mode: Literal["table", "ask"] = field(
        default="table",
        metadata=spec(
            doc='"table": route from a decision table the balancers send every route_table_ttl_s / 4 '
            'seconds, asking per request only without one; "ask": every request asks.'
        ),
    )
    route_table_ttl_s: float = field(
        default=0.2,
        metadata=spec(
            doc="Seconds a balancer's decision table is held.", checks=(greater(0.0), at_most(10.0))
        ),
    )
    http_workers: int = field(
        default=1,
        metadata=spec(
            doc="HTTP worker processes sharing the http port (SO_REUSEPORT), each a whole gateway; "
            "the role's process is worker 0; /metrics sums them all and an API key's limit holds "
            "over them all (see dsi.roles.entrypoint.workers).",
            checks=(greater(0), at_most(256)),
        ),
    )
    drain_timeout_s: float = field(
        default=30.0,
        metadata=spec(
            doc="Seconds a stopping gateway lets its requests in flight finish while /health and new "
            "requests are answered 503 (see dsi.roles.entrypoint.gateway).",
            checks=(at_least(0.0), at_most(3600.0)),
        ),
    )
    # Requests with images are then prepared in a worker thread.
    fetch_image_urls: bool = field(
        default=False,
        metadata=spec(
            doc="Fetch http(s) image URLs, from public addresses only (data URLs always work; see "
            "dsi.recipe.images)."
        ),
    )
    image_fetch_allow: tuple[IPNetwork, ...] = field(
        default=(),
        metadata=spec(
            doc="Networks image URLs may be fetched from although they are not public "
            '(["10.20.0.0/16"]: a private deployment\'s image host).',
            reader=_networks,
        ),
    )
    max_image_bytes: int = field(
        default=8 << 20, metadata=spec(doc="The largest image accepted, in bytes.", checks=(greater(0),))
    )
    max_images: int = field(
        default=16,
        metadata=spec(doc="The most images one request may carry.", checks=(greater(0), at_most(1024))),
    )


@rule(f'"" or {ENDPOINT_FORMS}')
def _optional_bind(text: str) -> str:
    return parse_bind(text) if text else text


@dataclass(slots=True, frozen=True, kw_only=True)
class KvstoreOptions:
    """Block store, index and index-delta publisher of one kvstore (see dsi.kvcache.store)."""

    store_dir: Path = field(
        default=Path("run/kvstore"),
        metadata=spec(doc="The store's directory: local disk by default, a 3FS mount in production."),
    )
    capacity_blocks: int = field(
        default=0, metadata=spec(doc="The most blocks the store holds (0: unbounded).", checks=(at_least(0),))
    )
    ttl_agent_s: float = field(
        default=3 * 86400.0,
        metadata=spec(
            doc="Seconds an agent request's blocks live from their creation.", checks=(greater(0.0),)
        ),
    )
    ttl_chatbot_s: float = field(
        default=7 * 86400.0,
        metadata=spec(
            doc="Seconds a chatbot request's blocks live from their creation.", checks=(greater(0.0),)
        ),
    )
    fsync: Literal["always", "segment", "never"] = field(
        default="segment",
        metadata=spec(
            doc='When to fdatasync: "always" before a put is acknowledged, "segment" when a segment is '
            'sealed, or "never".'
        ),
    )
    segment_bytes: int = field(
        default=1 << 30,
        metadata=spec(
            doc="The size at which a segment file is sealed, in bytes.", checks=(at_least(1 << 16),)
        ),
    )
    compact_below: float = field(
        default=0.5,
        metadata=spec(
            doc="Sealed segments whose live fraction is below this are rewritten (their live blocks copied).",
            checks=(at_least(0.0), at_most(1.0)),
        ),
    )
    read_workers: int = field(
        default=8, metadata=spec(doc="Threads that read blocks.", checks=(greater(0), at_most(256)))
    )
    max_inflight_reads: int = field(
        default=64, metadata=spec(doc="Blocks being read at once, at most.", checks=(greater(0),))
    )
    publish: str = field(
        default="",
        metadata=spec(
            doc='ZeroMQ endpoint the index deltas are published on; "": an ephemeral port where the '
            "role binds, told as the role's host (see dsi.config.addresses).",
            parse=_optional_bind,
        ),
    )
    publish_interval_s: float = field(
        default=1.0,
        metadata=spec(
            doc="Seconds of silence after which an empty delta goes out, so replicas notice a lost one.",
            checks=(greater(0.0),),
        ),
    )
    sweep_interval_s: float = field(
        default=60.0,
        metadata=spec(doc="Seconds between two sweeps (expiry and compaction).", checks=(greater(0.0),)),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineOptions:
    """A prefill or decode engine: dsi's own, or vLLM embedded in the role. The batch limits and
    expert-parallel (EP, see dsi.eplb) options are dsi's engine's (vLLM takes its own from
    ``[roles.vllm] args``)."""

    engine: Literal["dsi", "vllm"] = field(
        default="dsi",
        metadata=spec(doc="dsi's own engine, or vLLM embedded in the role (options in [roles.vllm])."),
    )
    vllm: VllmOptions = field(default_factory=VllmOptions, metadata=spec(checks=(only_for_vllm,)))

    max_batch_tokens: int = field(
        default=8192, metadata=spec(doc="Tokens one engine step computes, at most.", checks=(greater(0),))
    )
    max_running: int = field(
        default=64, metadata=spec(doc="Requests running at once, at most.", checks=(greater(0),))
    )
    num_blocks: int = field(
        default=1024, metadata=spec(doc="Block KV pages, the null page included.", checks=(greater(1),))
    )
    ep_size: int = field(
        default=1,
        metadata=spec(
            doc="Ranks of the instance's EP group (1: the MoE runs in the engine process).",
            checks=(greater(0), at_most(64)),
        ),
    )
    ep_redundant: int = field(
        default=1, metadata=spec(doc="Redundant expert slots per EP rank.", checks=(at_least(0),))
    )
    ep_window_steps: int = field(
        default=256,
        metadata=spec(doc="Steps of expert counts an EP rebalance looks at.", checks=(greater(0),)),
    )
    ep_rebalance_steps: int = field(
        default=1024,
        metadata=spec(doc="Steps between two EP rebalances (0: never).", checks=(at_least(0),)),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class ControllerOptions:
    """No options yet (drain, which will have them, is planned; autoscaling is the [autoscale] section)."""


@rule("increasing positive token counts")
def _token_edges(raw: Any, where: Where) -> tuple[int, ...]:
    if not isinstance(raw, list) or not raw or any(type(x) is not int for x in raw):
        raise where.error(f"expected a non-empty array of integers, got {describe(raw)}")
    if any(x <= 0 for x in raw) or raw != sorted(set(raw)):
        raise where.error(f"must be increasing positive token counts, got {raw}")
    return tuple(raw)


@dataclass(slots=True, frozen=True, kw_only=True)
class BalancerOptions:
    """A balancer routes prefill and decode requests (see dsi.roles.balancer and dsi.balance)."""

    bucket_edges: tuple[int, ...] = field(
        default=(16_384, 65_536, 262_144),
        metadata=spec(
            doc="Prefill buckets: the un-cached tokens where buckets 1, 2, ... start (DeepSeek's 16K / 64K / 256K).",
            reader=_token_edges,
        ),
    )
    rebalance_s: float = field(
        default=10.0,
        metadata=spec(doc="Seconds between two checks of the prefill bucket plan.", checks=(greater(0.0),)),
    )
    half_life_s: float = field(
        default=60.0,
        metadata=spec(doc="Seconds for a bucket's measured load to halve.", checks=(greater(0.0),)),
    )
    bucket_hysteresis: float = field(
        default=0.05,
        metadata=spec(
            doc="A bucket's load share must move by more than this (of 1) to redo the plan.",
            checks=(at_least(0.0), less(1.0)),
        ),
    )
    min_share: float = field(
        default=0.01,
        metadata=spec(
            doc="A bucket below this load share has no engine of its own.", checks=(at_least(0.0), less(1.0))
        ),
    )
    band_window: int = field(
        default=256,
        metadata=spec(
            doc="Decode bands: recent requests whose KV lengths set the bands.", checks=(greater(0),)
        ),
    )
    long_min_tokens: int = field(
        default=8_192,
        metadata=spec(
            doc="Decode bands: a request with fewer KV tokens is never long.", checks=(greater(0),)
        ),
    )
    band_hysteresis: float = field(
        default=0.1,
        metadata=spec(
            doc="The long band's load share must move by more than this (of 1) to change its size.",
            checks=(at_least(0.0), less(1.0)),
        ),
    )
    overload: float = field(
        default=0.9,
        metadata=spec(
            doc="Decode load score above which an instance with two requests or more is overloaded.",
            checks=(greater(0.0), at_most(1.0)),
        ),
    )
    report_timeout_s: float = field(
        default=3.0,
        metadata=spec(
            doc="Seconds after its last load report an instance gets no new work.", checks=(greater(0.0),)
        ),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class EncoderOptions:
    """A vision encoder (see dsi.roles.encoder): images batched across requests, embeddings kept
    by image digest until a prefill pulls them."""

    max_batch_images: int = field(
        default=16,
        metadata=spec(doc="Images encoded in one batch, at most.", checks=(greater(0), at_most(1024))),
    )
    cache_bytes: int = field(
        default=256 << 20,
        metadata=spec(doc="Bytes of embeddings kept for prefills to pull.", checks=(greater(0),)),
    )


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
