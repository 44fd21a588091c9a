"""dsi serve: how long it waits for the roles, and the command line each role runs (no process started)."""

import sys
from pathlib import Path

from dsi.cli.serve import STOP_GRACE_S, _Serve, default_ready_timeout, role_command
from dsi.config import load_config, parse_config

REPO = Path(__file__).resolve().parents[3]


def test_the_ready_timeout_is_60s_without_vllm_roles():
    assert default_ready_timeout(load_config(REPO / "configs" / "local.toml")) == 60.0


def test_vllm_roles_add_their_start_timeout():
    assert default_ready_timeout(load_config(REPO / "configs" / "vllm.toml")) == 600.0 + 60.0


def test_the_longest_start_timeout_counts(tmp_path):
    def vllm_role(name: str, port: int, start: float) -> dict:
        bind = f"tcp://127.0.0.1:{port}"
        return {"kind": name, "id": name, "bind": bind, "engine": "vllm", "vllm": {"start_timeout_s": start}}

    roles = [vllm_role("prefill", 7110, 900.0), vllm_role("decode", 7120, 30.0)]
    cfg = parse_config(
        {"cluster": {"controller": "tcp://127.0.0.1:7100"}, "roles": roles}, tmp_path / "n.toml"
    )
    assert default_ready_timeout(cfg) == 960.0


def test_a_role_runs_without_the_working_directory_on_its_path():
    assert role_command("node.toml", "decode-0", None) == [
        sys.executable, "-P", "-m", "dsi.cli.role", "--config", "node.toml", "--role", "decode-0",
    ]  # fmt: skip
    argv = role_command("node.toml", "entrypoint-0", 8001, python="/opt/vllm/bin/python")
    assert argv[:2] == ["/opt/vllm/bin/python", "-P"]
    assert argv[-2:] == ["--http-port", "8001"]


async def test_an_entrypoint_drains_within_the_stop_grace_and_every_role_logs_alike():
    serve = _Serve(load_config(REPO / "configs" / "local.toml"), None, 60.0, log_format="json")
    entry, decode = serve._command("entrypoint-0"), serve._command("decode-0")
    drain = float(entry[entry.index("--drain-timeout") + 1])
    assert drain == STOP_GRACE_S - 2.0  # local.toml drains 30 s: cut so that SIGKILL never comes first
    assert "--drain-timeout" not in decode
    assert entry[entry.index("--log-format") + 1] == decode[decode.index("--log-format") + 1] == "json"
