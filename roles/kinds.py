"""Which actor runs each role kind, built from the role's config."""

from __future__ import annotations

from dsi.config import (
    BalancerOptions,
    ConfigError,
    EncoderOptions,
    EngineOptions,
    EntrypointOptions,
    KvstoreOptions,
    NodeConfig,
    RoleConfig,
    addresses_of,
    load_config,
)
from dsi.config.autoscale import check_declared
from dsi.roles.curve import client_keys, server_keys
from dsi.roles.role import RoleActor

# Each kind's actor is imported when a role of that kind is made: a process that runs a
# controller, an entrypoint or a balancer never loads the engine (torch), which would cost it
# seconds of start-up and a few hundred MiB.


def make_actor(role: RoleConfig, node: NodeConfig) -> RoleActor:
    """A fresh, not yet started actor for `role`, named by its id."""
    options = role.options
    match role.kind:
        case "controller":
            return _controller(role, node)
        case "entrypoint" if isinstance(options, EntrypointOptions):
            from dsi.roles.entrypoint import EntrypointActor

            return EntrypointActor(role.id, options, node)
        case "prefill" | "decode" if isinstance(options, EngineOptions) and options.engine == "vllm":
            from dsi.roles.vllm import VllmDecodeActor, VllmPrefillActor
            from dsi.roles.vllm.role import VllmRoleSettings

            cls = VllmPrefillActor if role.kind == "prefill" else VllmDecodeActor
            return cls(role.id, VllmRoleSettings.of(role, node))
        case "prefill" if isinstance(options, EngineOptions):
            from dsi.roles.engine_role import EngineRoleSettings
            from dsi.roles.prefill import PrefillActor

            return PrefillActor(role.id, EngineRoleSettings.of(role, node))
        case "decode" if isinstance(options, EngineOptions):
            from dsi.roles.decode import DecodeActor
            from dsi.roles.engine_role import EngineRoleSettings

            return DecodeActor(role.id, EngineRoleSettings.of(role, node))
        case "encoder" if isinstance(options, EncoderOptions):
            from dsi.roles.encoder.actor import EncoderActor, EncoderSettings

            return EncoderActor(role.id, EncoderSettings.of(role, node))
        case "kvstore" if isinstance(options, KvstoreOptions):
            from dsi.roles.kvstore import KvstoreActor

            return KvstoreActor(
                role.id, options, addresses=addresses_of(role, node), keys=server_keys(node.security)
            )
        case "balancer" if isinstance(options, BalancerOptions):
            from dsi.model.family import served_config
            from dsi.roles.balancer import BalancerActor

            return BalancerActor(
                role.id,
                options,
                served_config(node.model.dir, node.model.config, node.model.gguf),
                controller=node.cluster.controller,
                keys=client_keys(node.security),
                refresh_s=node.cluster.heartbeat_interval_s,
            )
    raise ValueError(f"{role.id}: no actor for kind {role.kind!r} with {type(options).__name__}")


def _controller(role: RoleConfig, node: NodeConfig) -> RoleActor:
    """With [autoscale] and a kubernetes [provisioner], the controller scales the StatefulSets
    itself. ValueError when it cannot (too few declared roles, no API address)."""
    from dsi.provision.kube_api import KubeError
    from dsi.provision.kubernetes import KubernetesProvisioner
    from dsi.roles.controller import ControllerActor

    provisioner, declared = None, None
    kube = node.provisioner.kubernetes
    if node.autoscale is not None and node.provisioner.kind == "kubernetes" and kube is not None:
        try:
            # A pod runs its own role only (dsi-role --role): the scaled ids come from the whole file.
            whole = load_config(node.source)
            declared = {kind: [r.id for r in whole.roles_of(kind)] for kind in node.autoscale.scaled()}
            check_declared(
                node.autoscale, {kind: len(ids) for kind, ids in declared.items()}, str(node.source)
            )
            provisioner = KubernetesProvisioner.from_options(kube)
        except (ConfigError, KubeError) as exc:
            raise ValueError(f"{role.id}: {exc}") from exc
    return ControllerActor(
        role.id,
        node.cluster,
        autoscale=node.autoscale,
        keys=server_keys(node.security),
        provisioner=provisioner,
        declared=declared,
    )
