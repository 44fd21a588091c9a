"""[provisioner]: what starts and stops role instances for the controller.

    [provisioner]                       ProvisionerConfig(kind="kubernetes",
    kind = "kubernetes"          -->        kubernetes=KubernetesOptions(namespace="dsi", ...))
    [provisioner.kubernetes]
    namespace = "dsi"

``kind = "local"`` (the default) runs instances as processes on this host. ``"kubernetes"`` scales
one StatefulSet per role kind; its options live in ``[provisioner.kubernetes]``, a table that is
an error with any other kind (it would be read and then ignored).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from dsi.config.spec import Seen, greater, matches, rule, spec

# A DNS-1123 label, as Kubernetes requires of namespace names.
_LABEL = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
_LABEL_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit"
# A StatefulSet name is the prefix and a role kind; its pods add "-N".
_PREFIX = r"[a-z0-9][-a-z0-9]{0,30}"
_PREFIX_RULE = "lowercase letters, digits and '-', starting with a letter or digit, at most 31"


@rule('"" or an http(s):// base URL')
def _api_url(text: str) -> str:
    """ "" (in-cluster: from KUBERNETES_SERVICE_HOST/PORT) or an http(s)://HOST[:PORT] base URL."""
    if not text:
        return text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an http:// or https:// URL, got {text!r}")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(f"must be a base URL without a path, got {text!r}")
    return text.rstrip("/")


@dataclass(slots=True, frozen=True, kw_only=True)
class KubernetesOptions:
    """Where the StatefulSets are and how to reach the API server."""

    namespace: str = field(
        default="dsi",
        metadata=spec(doc="The namespace of the StatefulSets.", checks=(matches(_LABEL, _LABEL_RULE),)),
    )
    statefulset_prefix: str = field(
        default="dsi-",
        metadata=spec(
            doc="A StatefulSet is named this prefix and its role kind.",
            checks=(matches(_PREFIX, _PREFIX_RULE),),
        ),
    )
    api_url: str = field(
        default="",
        metadata=spec(
            doc='The API server\'s base URL; "": the in-cluster address (KUBERNETES_SERVICE_HOST and _PORT).',
            parse=_api_url,
        ),
    )
    token_file: Path | None = field(
        default=None,
        metadata=spec(
            doc="The bearer token file (default: the service account's, under "
            "/var/run/secrets/kubernetes.io/serviceaccount/)."
        ),
    )
    ca_file: Path | None = field(
        default=None,
        metadata=spec(doc="The API server's CA certificate (default: the service account's)."),
    )
    ready_timeout_s: float = field(
        default=600.0,
        metadata=spec(doc="Seconds a started pod gets to become Ready.", checks=(greater(0.0),)),
    )
    stop_timeout_s: float = field(
        default=120.0, metadata=spec(doc="Seconds a stopped pod gets to be gone.", checks=(greater(0.0),))
    )
    poll_interval_s: float = field(
        default=2.0,
        metadata=spec(
            doc="Seconds between two reads of a pod while waiting, and between two refreshes of the list.",
            checks=(greater(0.0),),
        ),
    )


def _kubernetes_default(seen: Seen) -> KubernetesOptions | None:
    return KubernetesOptions() if seen["kind"] == "kubernetes" else None


@rule('only with kind = "kubernetes"')
def _only_for_kubernetes(value: Any, seen: Seen) -> str | None:
    if value is not None and seen["kind"] != "kubernetes":
        return f'only allowed with kind = "kubernetes", got kind = {seen["kind"]!r}'
    return None


@dataclass(slots=True, frozen=True, kw_only=True)
class ProvisionerConfig:
    """What starts and stops role instances for the controller."""

    kind: Literal["local", "kubernetes"] = field(
        default="local",
        metadata=spec(
            doc='"local": processes on this host; "kubernetes": one StatefulSet per role kind, scaled.'
        ),
    )
    kubernetes: KubernetesOptions | None = field(
        default=None, metadata=spec(fallback=_kubernetes_default, checks=(_only_for_kubernetes,))
    )
