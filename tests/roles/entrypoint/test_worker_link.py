"""Workers of one role answer each other's metrics asks over their sockets: the worker a scrape
reaches sums them all, fast, and a worker that is gone or stuck is left out within the bound."""

import asyncio
import os
import secrets
import socket
import time

from dsi.roles.entrypoint import worker_link
from dsi.roles.entrypoint.metrics import Metrics
from dsi.roles.entrypoint.seat import WorkerSeat
from dsi.roles.entrypoint.worker_link import WorkerLink


def _seats(count: int) -> list[WorkerSeat]:
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    return [WorkerSeat(i, count, tag, "unused", (), True) for i in range(count)]


def _metrics(requests: int) -> Metrics:
    m = Metrics()
    for _ in range(requests):
        m.request_done("chat", 200)
    return m


def _count(text: str, series: str) -> str:
    return next(line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(series + " "))


async def test_the_scraped_worker_answers_for_every_worker():
    seats = _seats(3)
    links = [WorkerLink(seat, f"e.w{seat.index}", _metrics(seat.index + 1).render) for seat in seats]
    for link in links:
        await link.start()
    try:
        for link in links:  # whichever the scrape reaches
            t0 = time.perf_counter()
            text = await link.scrape()
            assert time.perf_counter() - t0 < 0.1
            assert _count(text, 'dsi_requests_total{protocol="chat",status="200"}') == "6"
            assert _count(text, "dsi_http_workers_answered") == "3"
    finally:
        for link in links:
            await link.close()


async def test_a_worker_gone_or_stuck_is_left_out_within_the_bound(monkeypatch):
    monkeypatch.setattr(worker_link, "ASK_TIMEOUT_S", 0.2)
    seats = _seats(3)
    alive = WorkerLink(seats[0], "e", _metrics(2).render)
    await alive.start()
    # worker 1 is gone (nothing listens); worker 2 accepts but never answers (stopped)
    stuck = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stuck.bind(seats[0].address(2))
    stuck.listen()
    try:
        t0 = time.perf_counter()
        text = await alive.scrape()
        assert time.perf_counter() - t0 < 0.5
        assert _count(text, 'dsi_requests_total{protocol="chat",status="200"}') == "2"
        assert _count(text, "dsi_http_workers") == "3"
        assert _count(text, "dsi_http_workers_answered") == "1"
    finally:
        stuck.close()
        await alive.close()


async def test_a_bad_ask_gets_no_answer_and_the_worker_goes_on():
    seats = _seats(2)
    link = WorkerLink(seats[1], "e.w1", _metrics(1).render)
    await link.start()
    try:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        await loop.sock_connect(sock, seats[1].address(1))
        await loop.sock_sendall(sock, b"\x00\x00\x00\x03abc")  # not a MetricsAsk
        assert await asyncio.wait_for(loop.sock_recv(sock, 100), 2) == b""  # closed, unanswered
        sock.close()
        asker = WorkerLink(seats[0], "e", _metrics(0).render)
        assert _count(await asker.scrape(), "dsi_http_workers_answered") == "2"
    finally:
        await link.close()
