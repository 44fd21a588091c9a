"""A live gateway: controller + decode + entrypoint in one ``dsi-role`` process on 127.0.0.1."""

import json
import re
import time
import urllib.error
import urllib.request

import pytest

from tests.dsi.cli.procs import Procs, local_config, python_module


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gateway")
    path = local_config(tmp, keep=("controller-0", "entrypoint-0", "prefill-0", "decode-0"), interval_s=0.3)
    text = path.read_text()
    http = re.search(r'http = "([^"]+)"', text).group(1)
    with Procs(tmp) as procs:
        proc = procs.start("cluster", python_module("dsi.cli.role", "--config", str(path)))
        proc.wait_ready()
        base = f"http://{http}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the entrypoint learns the instances by heartbeat
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
                    health = json.load(resp)
                    if health.get("instances", 0) >= 1 and health.get("prefill_instances", 0) >= 1:
                        break
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the gateway never saw ready prefill and decode instances:\n" + proc.log())
        yield base
