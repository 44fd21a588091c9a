"""dsi bench vllm-cluster's driver: the closed-loop replay against a small SSE server in this
process, and measure's start / warm / replay / stop sequence on a fake side."""

import asyncio
import json

from aiohttp import web

from dsi.bench.vllm_cluster_load import measure, replay
from dsi.bench.vllm_cluster_summary import PromptCounters
from dsi.transport.ports import free_port


class _Server:
    """Chat Completions as a stream of ``max_tokens`` one-word deltas and a usage chunk; it
    records the order requests arrived in and the most streams it had at once."""

    def __init__(self) -> None:
        self.arrived: list[str] = []
        self.live = self.most = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.arrived.append(body["messages"][0]["content"])
        self.live += 1
        self.most = max(self.most, self.live)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for _ in range(body["max_tokens"]):
                await asyncio.sleep(0.01)
                chunk = {"choices": [{"delta": {"content": " w"}}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            usage = {"prompt_tokens": 7, "completion_tokens": body["max_tokens"]}
            await resp.write(
                f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode()
            )
        finally:
            self.live -= 1
        return resp


async def _serve(handler: _Server) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler.chat)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _body(i: int, max_tokens: int = 3) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}], "max_tokens": max_tokens}


async def test_the_replay_keeps_order_and_at_most_its_concurrency():
    server = _Server()
    runner, url = await _serve(server)
    try:
        run = await replay(url, [_body(i) for i in range(7)], concurrency=3)
    finally:
        await runner.cleanup()
    assert server.arrived == [f"q{i}" for i in range(7)]
    assert server.most == 3
    assert [s.tokens for s in run.streams] == [3] * 7 and run.tokens == 21
    assert all(s.prompt_tokens == 7 and s.ttft_s is not None and s.error is None for s in run.streams)


class _FakeSide:
    """A side whose counters move by 100 computed tokens per read, served by a real SSE server."""

    def __init__(self, fail_start: bool = False, cold_reads: int = 0) -> None:
        self.server = _Server()
        self.fail_start = fail_start
        self.cold_reads = cold_reads  # reads at which the second instance has computed nothing
        self.reads = 0
        self.stopped = False
        self.loop = asyncio.new_event_loop()
        self.runner, self.url = self.loop.run_until_complete(_serve(self.server))
        self.thread = None

    @property
    def warm_urls(self) -> list[str]:
        return [self.url, self.url]

    def start(self, timeout_s: float) -> None:
        import threading

        if self.fail_start:
            raise RuntimeError("refused")
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def counters(self) -> list[PromptCounters]:
        self.reads += 1
        second = 0 if self.reads <= self.cold_reads else 10 * self.reads
        return [
            PromptCounters(computed=100 * self.reads, total=100 * self.reads),
            PromptCounters(computed=second, total=second),
        ]

    def stop(self) -> None:
        self.stopped = True
        if self.thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()


def test_measure_warms_replays_every_batch_and_stops_the_side():
    side = _FakeSide()
    out = measure(side, [[_body(0), _body(1)], [_body(2, 5)]], 2, "m", 10.0, settle_s=0.0)
    assert out.started and out.error is None and side.stopped
    assert side.server.arrived[:2] == ["Say hello number 0.", "Say hello number 1."]
    assert side.server.arrived[2:] == ["q0", "q1", "q2"]
    f = out.figures
    assert f.requests == 3 and f.output_tokens == 11
    assert f.computed_by_instance == [200, 20]  # 100 and 10 per batch (read before and after)
    assert f.computed_tokens_per_request == round(220 / 3, 1)


def test_the_warm_up_goes_on_until_every_instance_has_computed_a_prompt():
    side = _FakeSide(cold_reads=2)  # a balancer sent the first two rounds to the first instance
    out = measure(side, [[_body(0)]], 1, "m", 10.0, settle_s=0.0)
    assert out.error is None
    assert sorted(side.server.arrived[:-1]) == sorted([f"Say hello number {i}." for i in (0, 1)] * 3)
    assert side.server.arrived[-1] == "q0"


def test_an_instance_never_warm_is_an_error():
    side = _FakeSide(cold_reads=1_000)
    out = measure(side, [[_body(0)]], 1, "m", 10.0, settle_s=0.0)
    assert out.error == "RuntimeError: an instance computed no warm-up prompt in 8 rounds"
    assert side.stopped and "q0" not in side.server.arrived


def test_a_side_that_does_not_start_is_stopped_and_says_why():
    side = _FakeSide(fail_start=True)
    out = measure(side, [[_body(0)]], 1, "m", 10.0, settle_s=0.0)
    assert not out.started and out.figures is None
    assert out.error == "RuntimeError: refused" and side.stopped
