"""dsi status in this process: formatting, and an unreachable controller."""

import json
import re

import msgspec

from dsi.cli import status
from dsi.cli.main import main
from dsi.cli.status import format_table, table_json
from dsi.cli.status_spec import format_curves
from dsi.messages.control import InstanceInfo, InstanceTable, Load, StepCurveView, TransitionCount
from dsi.messages.fingerprint import MachineFingerprint
from dsi.transport.security import generate_keys
from tests.dsi.cli.procs import Procs, free_port, local_config, python_module
from tests.fingerprints import fingerprint

INFO = InstanceInfo(
    "prefill-0",
    "prefill",
    "10.0.0.2",
    4321,
    "tcp://10.0.0.2:7110",
    "serving",
    Load(running=3, queued=1, kv_tokens=512),
    last_seen_s=2.71,
    started_at=1.0e9,
    suspect=True,
)


def test_table_has_one_aligned_row_per_instance():
    lines = format_table([INFO]).splitlines()
    assert lines[0].split() == [
        "INSTANCE",
        "ROLE",
        "HOST",
        "PID",
        "STATE",
        "PROTOCOL",
        "LOAD",
        "LAST",
        "SEEN",
        "FINGERPRINT",
    ]
    assert lines[1].split() == [
        "prefill-0",
        "prefill",
        "10.0.0.2",
        "4321",
        "serving/suspect",
        "2",  # a heartbeat without the field: a sender of protocol version 2
        "run=3",
        "queue=1",
        "kv=512",
        "inbox=0",
        "2.7s",
        "ago",
        "-",  # no fingerprint reported
    ]
    assert lines[0].index("STATE") == lines[1].index("serving/suspect")


def test_json_is_plain_objects():
    moves = [TransitionCount("prefill", "ready", "serving", 2)]
    data = table_json(InstanceTable([INFO], controller_id="controller-0", transitions=moves))
    assert data["controller"] == "controller-0"
    [info] = data["instances"]
    assert info["load"] == {
        "running": 3, "queued": 1, "kv_tokens": 512, "inbox": 0, "uncached_tokens": 0,
        "queued_pixels": 0, "ep_ranks": 0, "ep_configured": 0,
        "speculative": "", "step_curve": None, "accept_rates": [],
    }  # fmt: skip
    assert (info["instance_id"], info["state"], info["suspect"], info["pid"]) == (
        "prefill-0",
        "serving",
        True,
        4321,
    )
    assert data["transitions"] == [{"role": "prefill", "from": "ready", "to": "serving", "count": 2}]
    assert info["fingerprint"] is None and data["warnings"] == []


def test_unreachable_controller_exits_1_with_a_clear_message(capsys):
    address = f"tcp://127.0.0.1:{free_port()}"
    assert main(["status", "--controller", address, "--timeout", "0.5"]) == 1
    err = capsys.readouterr().err
    assert f"cannot reach the controller at {address} within 0.5s" in err


def test_with_curve_status_uses_the_configs_client_key(tmp_path, capsys):
    keys = generate_keys(tmp_path / "keys")
    config = local_config(tmp_path, keep=["controller-0"])
    config.write_text(
        config.read_text()
        + f"""
[security]
curve = true
server_secret_key = "{keys["server_secret"]}"
server_public_key = "{keys["server_public"]}"
client_secret_key = "{keys["client_secret"]}"
authorized_keys_dir = "{keys["authorized_dir"]}"
"""
    )
    with Procs(tmp_path) as procs:
        role = python_module("dsi.cli.role", "--config", str(config))
        assert procs.start("controller", role).wait_ready() == "READY controller-0"
        # READY comes once the controller lists itself: no waiting
        assert main(["status", "--config", str(config), "--json"]) == 0
        [info] = json.loads(capsys.readouterr().out)["instances"]
        assert (info["instance_id"], info["state"]) == ("controller-0", "serving")
        address = re.search(r'controller = "([^"]+)"', config.read_text()).group(1)
        assert main(["status", "--controller", address, "--timeout", "0.5"]) == 1  # no client key
        assert "cannot reach the controller" in capsys.readouterr().err


def test_a_speculating_decode_shows_its_step_time_curve():
    curve = StepCurveView([1, 8], [1, 2], [[60.0, 66.5], [90.0, 120.25]], [5.0, 7.5])
    load = Load(running=2, speculative="dspark", step_curve=curve, accept_rates=(0.62, 0.5, -1.0))
    info = InstanceInfo("decode-0", "decode", "h", 7, "tcp://h:7120", "serving", load, 0.5, 1.0e9)
    assert "spec=dspark" in format_table([info]).splitlines()[1].split()
    lines = format_curves([info, INFO]).splitlines()
    assert lines[0] == "decode-0 speculative dspark, accepted per draft position: 0.62 0.50 -"
    assert lines[3].split() == ["batch", "8", "90.0", "120.2", "7.5"]
    data = json.loads(json.dumps(table_json(InstanceTable([info], controller_id="c"))))
    assert data["instances"][0]["load"]["step_curve"] == {
        "batches": [1, 8], "lengths": [1, 2], "step_ms": [[60.0, 66.5], [90.0, 120.25]], "draft_ms": [5.0, 7.5],
    }  # fmt: skip
    assert data["instances"][0]["load"]["accept_rates"] == [0.62, 0.5, -1.0]
    # and the heartbeat's Load survives the wire
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(load), type=Load) == load


def test_an_expert_parallel_instance_shows_its_ranks():
    info = InstanceInfo(
        "decode-0",
        "decode",
        "10.0.0.3",
        7,
        "tcp://10.0.0.3:7120",
        "serving",
        Load(ep_ranks=3, ep_configured=4),
        last_seen_s=0.5,
        started_at=1.0e9,
    )
    assert "ep=3/4" in format_table([info]).splitlines()[1].split()
    assert "ep=" not in format_table([INFO])


def engine(instance_id: str, fp: MachineFingerprint | None, state: str = "serving") -> InstanceInfo:
    role = instance_id.split("-")[0]
    return InstanceInfo(instance_id, role, "h", 7, "tcp://h:7120", state, Load(), 0.5, 1.0e9, fingerprint=fp)


def status_output(table: InstanceTable, capsys, monkeypatch, *flags: str) -> str:
    """``dsi status FLAGS`` against a controller that answers `table` (autoscaling off, no balancers)."""

    async def fetch(address, keys, timeout):
        return table, None

    monkeypatch.setattr(status, "_fetch_status", fetch)
    assert main(["status", "--controller", "tcp://127.0.0.1:1", *flags]) == 0
    return capsys.readouterr().out


def test_each_engine_shows_its_fingerprint_and_one_machine_gives_no_warning(capsys, monkeypatch):
    fp = fingerprint()
    table = InstanceTable([engine("decode-0", fp), engine("decode-1", fp), engine("prefill-0", fp), INFO])
    out = status_output(table, capsys, monkeypatch)
    lines = out.splitlines()
    assert lines[1].split()[-1 - len(fp.isa_summary().split()) :] == [
        fp.digest[:8],
        *fp.isa_summary().split(),
    ]
    assert fp.isa_summary() == "avx2 fma avx512{f,bw,vl,vnni}"
    assert lines[-1].endswith(" -")  # prefill-0 of INFO reports none
    assert "warning" not in out
    data = json.loads(status_output(table, capsys, monkeypatch, "--json"))
    assert data["warnings"] == []
    assert data["instances"][0]["fingerprint"] == {
        "digest": fp.digest, "arch": "x86_64", "isa": list(fp.isa), "cpu_capability": "AVX512",
        "torch": "2.13.0+cpu", "mkl": "2024.2-Product Build 20240605", "onednn": "3.12.0", "threads": 8,
        "native": {"paged_attention": True, "row_ops": True}, "env": {}, "cpu_model": "Intel(R) Xeon(R) Gold 6338",
        "engine": "",  # dsi's own engine (a vLLM role names vLLM, its model, dtype and KV layout)
    }  # fmt: skip


def test_a_role_whose_serving_instances_differ_is_warned_about(capsys, monkeypatch):
    same, fewer_threads, no_kernel = (
        fingerprint(),
        fingerprint(threads=4),
        fingerprint(native={"paged_attention": False, "row_ops": True}),
    )
    table = InstanceTable(
        [
            engine("decode-0", same),
            engine("decode-1", fewer_threads),
            engine("decode-2", no_kernel),
            engine("decode-3", fingerprint(isa=("avx2",)), state="draining"),  # not serving: not compared
            engine("prefill-0", same),
            engine(
                "prefill-1", fingerprint(cpu_model="AMD EPYC 9654")
            ),  # the model name alone decides nothing
        ]
    )
    warning = (
        f"warning: serving decode instances have different machine fingerprints: decode-0 {same.digest[:8]}, "
        f"decode-1 {fewer_threads.digest[:8]}, decode-2 {no_kernel.digest[:8]} (differ in threads, native); "
        f"exact decode failover and exact prefix hits with a pulled SWA state cannot hold between them"
    )
    out = status_output(table, capsys, monkeypatch)
    assert [line for line in out.splitlines() if "warning" in line] == [warning]
    assert out.splitlines()[len(table.instances) + 1] == warning  # right under the table
    data = json.loads(status_output(table, capsys, monkeypatch, "--json"))
    assert data["warnings"] == [warning]
    assert [i["fingerprint"]["threads"] for i in data["instances"]] == [8, 4, 8, 8, 8, 8]


def test_mixed_prefills_are_warned_about_apart_from_decodes():
    table = [engine("prefill-0", fingerprint()), engine("prefill-1", fingerprint(torch="2.12.0+cpu"))]
    table += [engine("decode-0", fingerprint(torch="2.12.0+cpu"))]
    [warning] = table_json(InstanceTable(table))["warnings"]
    assert warning.startswith(
        "warning: serving prefill instances have different machine fingerprints: prefill-0"
    )
    assert "(differ in torch)" in warning and "decode-0" not in warning
