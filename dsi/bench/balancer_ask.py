"""What asking a balancer costs the entrypoint per request, beside the local pick it replaces.

    python -m dsi.bench.balancer_ask [--requests 2000] [--json]

Starts a controller + balancer process (``dsi-role``) on free 127.0.0.1 ports; four fake
engines (2 prefill, 2 decode) heartbeat to the controller and push load reports to the balancer
every 0.2 s from this process. Then, one request at a time, in this process:

    ask both    BalancerRouter.route(prefill=True): the prefill and decode RouteQuery, concurrently
    ask decode  the decode RouteQuery alone
    local pick  InstancePool.pick over the same four instances (today's least loaded, no I/O)

Figures: median and p99 microseconds per request; ``ask both / local pick`` as a ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq.asyncio

from dsi.messages import ALL
from dsi.messages.balancer import BalancerStatus, LoadReport
from dsi.messages.control import Heartbeat, InstanceInfo, InstanceTable, Load
from dsi.roles.entrypoint.backends import InstancePool
from dsi.roles.entrypoint.router import Ask, BalancerRouter
from dsi.transport.client import Peer
from dsi.transport.ports import free_port

ENGINES = ("prefill-0", "prefill-1", "decode-0", "decode-1")


def _config(path: Path, controller: str, balancer: str) -> None:
    path.write_text(f"""[cluster]
controller = "{controller}"
heartbeat_interval_s = 0.5

[logging]
level = "warning"

[[roles]]
kind = "controller"
id = "controller-0"
bind = "{controller}"

[[roles]]
kind = "balancer"
id = "balancer-0"
bind = "{balancer}"
""")


async def _feed(controller: Peer, balancer: Peer, engines: dict[str, str]) -> None:
    while True:
        for i, address in engines.items():
            role = i.split("-")[0]
            await controller.ask(Heartbeat(i, role, "127.0.0.1", 1, address, assigned="serving"))
            # Roomy capacity and an ever-growing accepted count: every report retires the routes
            # made since the last one, so the fake decodes never fill up with pending requests.
            balancer.tell(
                LoadReport(
                    i,
                    role,
                    1.0,
                    running=int(i[-1]),
                    kv_tokens=1_000 * int(i[-1]),
                    max_requests=1 << 20,
                    kv_capacity_tokens=1 << 40 if role == "decode" else 0,
                    accepted=time.monotonic_ns(),
                )
            )
        await asyncio.sleep(0.2)


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[int(len(ordered) * 0.99) - 1] * 1e6, 1),
    }


async def _measure(controller: str, balancer: str, n: int) -> dict[str, dict[str, float]]:
    ctx = zmq.asyncio.Context()
    engines = {i: f"tcp://127.0.0.1:{free_port()}" for i in ENGINES}
    cpeer = Peer(controller, ctx, types=ALL, peer_id="bench")
    bpeer = Peer(balancer, ctx, types=ALL, peer_id="bench")
    await cpeer.connect(30)
    await bpeer.connect(30)
    feeding = asyncio.ensure_future(_feed(cpeer, bpeer, engines))
    router = BalancerRouter([balancer], ctx, bound_s=1.0, mode="ask")
    await router.start()
    pool = InstancePool(controller, ctx, role="decode")
    table = InstanceTable(
        [
            InstanceInfo(i, i.split("-")[0], "127.0.0.1", 1, a, "serving", Load(), 0.0, 1.0)
            for i, a in engines.items()
            if i.startswith("decode")
        ]
    )

    async def listed(msg, timeout=None):
        return table

    pool._controller.ask = listed  # type: ignore[method-assign]
    await pool.refresh()
    try:
        for _ in range(600):  # until the balancer routes both roles
            views = (await bpeer.ask(BalancerStatus())).instances
            if (
                router._choose() is not None
                and sum(v.state == "serving" and v.report_age_s >= 0 for v in views) == 4
            ):
                break
            await asyncio.sleep(0.05)
        ask = Ask(prompt_tokens=2_000, cached_tokens=512)
        both, decode, local = [], [], []
        for _ in range(n):
            t = time.perf_counter()
            pre, dec, _ = await router.route(ask, prefill=True)
            both.append(time.perf_counter() - t)
            if isinstance(pre, str) or isinstance(dec, str):
                raise RuntimeError(f"the balancer did not route: {pre!r} {dec!r}")
            t = time.perf_counter()
            await router.route(ask, prefill=False)
            decode.append(time.perf_counter() - t)
            t = time.perf_counter()
            pool.pick()
            local.append(time.perf_counter() - t)
        out = {"ask_both": _stats(both), "ask_decode": _stats(decode), "local_pick": _stats(local)}
        out["ratio"] = {
            "ask_both_over_local_pick": round(statistics.median(both) / statistics.median(local), 1)
        }
        return out
    finally:
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        await router.close()
        await pool.close()
        await cpeer.close()
        await bpeer.close()
        ctx.destroy(linger=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dsi.bench.balancer_ask")
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    controller, balancer = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "balancer.toml"
        _config(config, controller, balancer)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dsi.cli.role", "--config", str(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            if not (proc.stdout.readline() if proc.stdout else b"").startswith(b"READY"):
                raise RuntimeError("the controller + balancer process did not start")
            import uvloop

            figures = uvloop.run(_measure(controller, balancer, args.requests))
        finally:
            os.killpg(proc.pid, 9)
            proc.wait()
    if args.json:
        print(json.dumps(figures))
    else:
        for name, values in figures.items():
            print(f"{name:12s} " + "  ".join(f"{k} {v}" for k, v in values.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
