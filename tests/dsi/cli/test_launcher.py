"""The test suite's preloaded role launcher: a forked engine role is a process of its own, in a
session of its own, and its exit code comes back as Popen's would."""

from __future__ import annotations

import os
import signal

from tests.dsi.cli.launcher import LaunchedProcess
from tests.dsi.cli.procs import engine_role_args, local_config, python_module


def test_a_forked_prefill_serves_and_its_exit_codes_come_back(procs, tmp_path):
    config = local_config(tmp_path, keep=["controller-0", "prefill-0", "decode-0"])
    role = python_module("dsi.cli.role", "--config", str(config), "--role")
    assert engine_role_args([*role, "controller-0"]) is None  # started afresh
    controller = procs.start("controller", [*role, "controller-0"])
    assert not isinstance(controller.popen, LaunchedProcess)
    assert controller.wait_ready() == "READY controller-0"

    prefill = procs.start("prefill", [*role, "prefill-0"])
    decode = procs.start("decode", [*role, "decode-0"])
    assert isinstance(prefill.popen, LaunchedProcess) and isinstance(decode.popen, LaunchedProcess)
    assert prefill.wait_ready() == "READY prefill-0" and decode.wait_ready() == "READY decode-0"
    assert os.getsid(prefill.pid) == prefill.pid != os.getsid(0)
    assert prefill.popen.poll() is None

    prefill.signal(signal.SIGTERM)  # a graceful stop: Goodbye, exit 0
    assert prefill.wait(30) == 0
    decode.signal(signal.SIGKILL)
    assert decode.wait(30) == -signal.SIGKILL
