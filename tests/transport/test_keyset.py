"""Cluster key sets: files 0600, no silent overwrite, a snippet that load_config reads, and keys
that work: a holder of the set is served, anyone else gets nothing."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import zmq.asyncio

from dsi.config import load_config
from dsi.errors import AskTimeout
from dsi.roles.curve import client_keys, server_keys
from dsi.transport.client import Peer
from dsi.transport.keyset import KeySetError, create_key_set, load_key_set
from dsi.transport.security import Authenticator
from dsi.transport.server import ActorServer
from tests.transport.echo import ECHO_TYPES, Echo, EchoActor

NODE = """\
[cluster]
controller = "tcp://127.0.0.1:7100"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "tcp://127.0.0.1:7100"
"""


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_is_0600_and_every_client_is_authorised(tmp_path):
    keyset = create_key_set(tmp_path / "keys", ["prefill", "decode", "operator"])
    files = [p for p in (tmp_path / "keys").rglob("*") if p.is_file()]
    assert len(files) == 2 + 3 * 2
    assert {_mode(p) for p in files} == {0o600}
    assert _mode(tmp_path / "keys") == _mode(tmp_path / "keys" / "clients") == 0o700
    assert [c.name for c in keyset.clients] == ["decode", "operator", "prefill"]
    assert all(c.authorized for c in keyset.clients) and len({c.public for c in keyset.clients}) == 3
    assert load_key_set(tmp_path / "keys") == keyset


def test_existing_keys_are_replaced_only_with_force(tmp_path):
    first = create_key_set(tmp_path / "keys", ["a", "b"])
    with pytest.raises(KeySetError, match=r"already holds keys .* pass --force"):
        create_key_set(tmp_path / "keys", ["a"])
    assert load_key_set(tmp_path / "keys") == first  # untouched
    second = create_key_set(tmp_path / "keys", ["a"], force=True)
    assert second.server_public != first.server_public
    assert [c.name for c in second.clients] == ["a"]  # b's keys are gone, from the allow-list too
    assert [p.name for p in (tmp_path / "keys" / "authorized").iterdir()] == ["a.key"]


@pytest.mark.parametrize(
    ("names", "reason"),
    [
        ([], "at least one"),
        (["ok", "no/slash"], "letters, digits"),
        (["a", "a"], "repeat: a"),
        ([".x"], "letters"),
    ],
)
def test_bad_client_names_are_refused_before_anything_is_written(tmp_path, names, reason):
    with pytest.raises(KeySetError, match=reason):
        create_key_set(tmp_path / "keys", names)
    assert not (tmp_path / "keys").exists()


def test_a_folder_without_keys_says_how_to_make_them(tmp_path):
    with pytest.raises(KeySetError, match="dsi keys create --out"):
        load_key_set(tmp_path)


def test_the_snippet_loads_with_the_chosen_client(tmp_path):
    keyset = create_key_set(tmp_path / "keys", ["node", "operator"])
    path = tmp_path / "node.toml"
    path.write_text(NODE + "\n" + keyset.snippet("operator"))
    security = load_config(path).security
    assert security.curve is True
    assert security.server_secret_key == keyset.server_secret_file
    assert security.client_secret_key == tmp_path / "keys" / "clients" / "operator.key_secret"
    assert security.authorized_keys_dir == tmp_path / "keys" / "authorized"
    with pytest.raises(KeySetError, match="no client 'other'"):
        keyset.snippet("other")


async def test_a_holder_of_the_set_talks_and_no_one_else_gets_a_reply(tmp_path):
    keyset = create_key_set(tmp_path / "keys", ["node", "operator"])
    other = create_key_set(tmp_path / "other", ["node"])
    configs = {}
    for name, ks, client in (
        ("node", keyset, "node"),
        ("operator", keyset, "operator"),
        ("stranger", other, "node"),
    ):
        path = tmp_path / f"{name}.toml"
        path.write_text(NODE + "\n" + ks.snippet(client))
        configs[name] = load_config(path).security
    keys = server_keys(configs["node"])
    ctx = zmq.asyncio.Context()
    auth = Authenticator(ctx, keys)
    server = ActorServer(EchoActor(), "tcp://127.0.0.1:*", ctx, role="secure", keys=keys)
    await server.start()
    try:
        operator = Peer(
            server.address, ctx, types=ECHO_TYPES, keys=client_keys(configs["operator"]), timeout=10.0
        )
        try:
            assert (await operator.connect()).role == "secure"
            assert await operator.ask(Echo("over curve")) == Echo("over curve")
        finally:
            await operator.close()
        for keys_of in (None, client_keys(configs["stranger"])):
            intruder = Peer(server.address, ctx, types=ECHO_TYPES, keys=keys_of, timeout=0.5)
            try:
                with pytest.raises(AskTimeout):
                    await intruder.connect()
                with pytest.raises(AskTimeout):
                    await intruder.ask(Echo("let me in"))
            finally:
                await intruder.close()
        assert server.actor.handled == 1 and server.errors_sent == 0
    finally:
        await server.stop()
        auth.stop()
        ctx.term()
