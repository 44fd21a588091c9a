"""Key sets for the keyed-link tests, as ``dsi keys create`` writes them."""

from __future__ import annotations

from pathlib import Path

from dsi.transport.keyset import KeySet, create_key_set
from dsi.transport.kv.linkkeys import LinkKeys
from dsi.transport.security import CurveKeys


def key_set(folder: Path, clients: tuple[str, ...] = ("cluster",)) -> KeySet:
    return create_key_set(folder, list(clients))


def node_keys(keyset: KeySet, client: str = "cluster") -> CurveKeys:
    """A node's keys from ``keyset``, as ``[security]`` loads them for a role."""
    return CurveKeys.load(
        keyset.server_public_file,
        keyset.client_secret_file(client),
        server_secret_key=keyset.server_secret_file,
        authorized_keys_dir=keyset.authorized_dir,
    )


def link_keys(keyset: KeySet, client: str = "cluster") -> LinkKeys:
    return LinkKeys.from_curve(node_keys(keyset, client))
