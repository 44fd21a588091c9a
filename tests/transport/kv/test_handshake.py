"""The tcp link handshake, pure: both ends agree on fresh per-direction keys only when each
proves its keys; a Hello that proves nothing is answered with nothing and leaves nothing behind."""

from __future__ import annotations

import dataclasses

import pytest
import zmq
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from zmq.utils import z85

from dsi.transport.kv.handshake import (
    HELLO_BYTES,
    ClientHandshake,
    HandshakeFailed,
    SeenEphemerals,
    accept,
)
from dsi.transport.kv.linkkeys import public_bytes
from tests.transport.kv.keys import key_set, link_keys


@pytest.fixture
def cluster(tmp_path):
    return key_set(tmp_path / "keys", ("cluster", "b"))


def test_curve_keys_are_x25519_keys():
    public, secret = zmq.curve_keypair()
    assert public_bytes(X25519PrivateKey.from_private_bytes(z85.decode(secret))) == z85.decode(public)


def test_both_ends_agree_on_fresh_keys_one_per_direction(cluster):
    keys = link_keys(cluster)
    assert len(keys.allowed) == 2 and keys.client_public in keys.allowed
    client = ClientHandshake(keys)
    assert len(client.hello) == HELLO_BYTES
    welcome, server_side = accept(keys, client.hello, SeenEphemerals())
    client_side = client.finish(welcome)
    assert client_side.send == server_side.receive and client_side.receive == server_side.send
    assert client_side.send != client_side.receive and len(client_side.send) == 32
    again = ClientHandshake(keys)  # a new connection: new ephemerals, new keys (forward secrecy)
    other = again.finish(accept(keys, again.hello, SeenEphemerals())[0])
    assert other.send != client_side.send and again.hello[5:37] != client.hello[5:37]


def test_a_client_key_off_the_allow_list_gets_nothing(cluster, tmp_path):
    stranger = link_keys(key_set(tmp_path / "other"))
    # the right server public key, a client keypair the cluster does not admit
    outsider = dataclasses.replace(stranger, server_public=link_keys(cluster).server_public)
    seen = SeenEphemerals()
    assert accept(link_keys(cluster), ClientHandshake(outsider).hello, seen) is None
    assert accept(link_keys(cluster), ClientHandshake(stranger).hello, seen) is None  # wrong set
    assert len(seen) == 0  # nothing kept


def test_an_allowed_public_key_without_its_secret_gets_nothing(cluster, tmp_path):
    keys = link_keys(cluster)
    forger = dataclasses.replace(
        keys, client_secret=X25519PrivateKey.generate()
    )  # shows the allowed public key
    assert accept(keys, ClientHandshake(forger).hello, SeenEphemerals()) is None


def test_a_replayed_or_altered_hello_gets_nothing(cluster):
    keys = link_keys(cluster)
    seen = SeenEphemerals()
    hello = ClientHandshake(keys).hello
    assert accept(keys, hello, seen) is not None
    assert accept(keys, hello, seen) is None  # replayed
    fresh = bytearray(ClientHandshake(keys).hello)
    fresh[-1] ^= 1
    assert accept(keys, bytes(fresh), seen) is None
    assert accept(keys, hello[:-1], seen) is None


def test_a_receiver_without_the_server_secret_cannot_answer(cluster, tmp_path):
    keys = link_keys(cluster)
    client = ClientHandshake(keys)
    impostor = link_keys(key_set(tmp_path / "impostor"))
    impostor = dataclasses.replace(impostor, allowed=frozenset({keys.client_public}))
    assert accept(impostor, client.hello, SeenEphemerals()) is None
    welcome, _ = accept(keys, client.hello, SeenEphemerals())
    forged = bytearray(welcome)
    forged[-3] ^= 0x40
    with pytest.raises(HandshakeFailed, match="server key"):
        client.finish(bytes(forged))
    with pytest.raises(HandshakeFailed):
        ClientHandshake(keys).finish(welcome)  # a Welcome made for another connection
