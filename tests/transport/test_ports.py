"""free_port: distinct ports, inside DSI_PORT_RANGE where it is set."""

from __future__ import annotations

import socket

import pytest

from dsi.transport import ports
from dsi.transport.ports import RANGE_VARIABLE, free_port, port_range


@pytest.fixture
def fresh(monkeypatch):
    """free_port with nothing handed out yet in this process."""
    monkeypatch.setattr(ports, "_HANDED_OUT", set())
    return monkeypatch


def _free_pair(first: int = 20_000, last: int = 32_000) -> int:
    """A port p with p and p + 1 both free now."""
    for p in range(first, last):
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise AssertionError("no two adjacent free ports")


def test_without_a_range_the_ports_are_distinct_and_bindable(fresh):
    fresh.delenv(RANGE_VARIABLE, raising=False)
    picked = [free_port() for _ in range(50)]
    assert len(set(picked)) == 50
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", picked[-1]))


def test_every_port_comes_from_the_range_and_none_twice(fresh):
    fresh.setenv(RANGE_VARIABLE, "21000-21063")
    picked = [free_port() for _ in range(40)]
    assert len(set(picked)) == 40
    assert all(21_000 <= p <= 21_063 for p in picked)


def test_a_taken_port_is_passed_over_and_a_full_range_is_an_error(fresh):
    p = _free_pair()
    fresh.setenv(RANGE_VARIABLE, f"{p}-{p + 1}")
    with socket.socket() as held:
        held.bind(("127.0.0.1", p))
        held.listen()
        assert free_port() == p + 1
        with pytest.raises(OSError, match=rf"no free TCP port on 127.0.0.1 in {RANGE_VARIABLE} {p}-{p + 1}"):
            free_port()  # p is taken, p + 1 already handed out


@pytest.mark.parametrize("text", ["20000", "20000-", "a-b", "30000-20000", "0-10", "1-70000", "20000:20010"])
def test_a_malformed_range_names_the_variable(text):
    with pytest.raises(ValueError, match=RANGE_VARIABLE):
        port_range({RANGE_VARIABLE: text})


def test_unset_or_empty_means_the_kernel_picks():
    assert port_range({}) is None
    assert port_range({RANGE_VARIABLE: " "}) is None
    assert port_range({RANGE_VARIABLE: " 1024-2047 "}) == (1024, 2047)
