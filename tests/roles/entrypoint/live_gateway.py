"""A live gateway for tests: the kept roles of the local config in one ``dsi-role`` process on
127.0.0.1, yielded once the gateway serves (its /health is 200 with a prefill and a decode)."""

from __future__ import annotations

import contextlib
import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.dsi.cli.procs import Procs, local_config, python_module


@contextlib.contextmanager
def live_gateway(tmp: Path, keep: Sequence[str], timeout_s: float = 60.0) -> Iterator[str]:
    """The gateway's base URL (``http://host:port``); every process is stopped on exit."""
    path = local_config(tmp, keep=tuple(keep), interval_s=0.3)
    base = "http://" + re.search(r'http = "([^"]+)"', path.read_text()).group(1)  # type: ignore[union-attr]
    with Procs(tmp) as procs:
        proc = procs.start("cluster", python_module("dsi.cli.role", "--config", str(path)))
        proc.wait_ready()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:  # the entrypoint learns the instances by heartbeat
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:  # 503 raises
                    health = json.load(resp)
                    if health.get("instances", 0) >= 1 and health.get("prefill_instances", 0) >= 1:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the gateway never saw ready prefill and decode instances:\n" + proc.log())
        yield base
