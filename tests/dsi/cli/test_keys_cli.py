"""``dsi keys``: create prints a [security] section that is all a node needs; a live controller
with it answers ``dsi status`` with the operator's key, and nothing without the set's keys."""

from __future__ import annotations

import json
import re
import stat

from dsi.cli.main import main
from dsi.config import load_config
from tests.dsi.cli.procs import Procs, local_config, python_module


def _section(out: str) -> str:
    """The printed snippet: from its comment lines before ``[security]`` to the end."""
    start = out.index("# CURVE keys of")
    return out[start:]


def test_create_show_and_refuse_to_overwrite(tmp_path, capsys):
    keys = tmp_path / "keys"
    assert main(["keys", "create", "--out", str(keys), "--roles", "node", "operator"]) == 0
    created = capsys.readouterr().out
    assert re.search(r"(?m)^server public key: \S{40}$", created)
    assert re.search(r"(?m)^client node: \S{40}$", created) and re.search(
        r"(?m)^client operator: \S{40}$", created
    )
    assert f'client_secret_key = "{keys}/clients/node.key_secret"' in created  # the first --roles name
    assert {stat.S_IMODE(p.stat().st_mode) for p in keys.rglob("*") if p.is_file()} == {0o600}

    assert main(["keys", "show", str(keys)]) == 0
    shown = capsys.readouterr().out
    assert shown.splitlines()[:3] == created.splitlines()[2:5]  # the same public keys
    assert main(["keys", "show", str(keys), "--client", "operator"]) == 0
    assert f'client_secret_key = "{keys}/clients/operator.key_secret"' in capsys.readouterr().out

    before = (keys / "server.key_secret").read_bytes()
    assert main(["keys", "create", "--out", str(keys)]) == 1
    assert "pass --force" in capsys.readouterr().err
    assert (keys / "server.key_secret").read_bytes() == before
    assert main(["keys", "create", "--out", str(keys), "--force"]) == 0
    assert (keys / "server.key_secret").read_bytes() != before

    assert main(["keys", "show", str(tmp_path / "none")]) == 1
    assert "dsi keys create --out" in capsys.readouterr().err


def test_a_live_controller_serves_the_sets_holders_only(tmp_path, capsys):
    keys = tmp_path / "keys"
    assert main(["keys", "create", "--out", str(keys), "--roles", "node", "operator"]) == 0
    node_section = _section(capsys.readouterr().out)
    assert main(["keys", "show", str(keys), "--client", "operator"]) == 0
    operator_section = _section(capsys.readouterr().out)
    assert main(["keys", "create", "--out", str(tmp_path / "other")]) == 0
    stranger_section = _section(capsys.readouterr().out)

    node = local_config(tmp_path, keep=["controller-0"])
    base = node.read_text()
    node.write_text(base + "\n" + node_section)
    configs = {}
    for name, section in (("operator", operator_section), ("stranger", stranger_section)):
        configs[name] = tmp_path / f"{name}.toml"
        configs[name].write_text(base + "\n" + section)
    assert load_config(node).security.client_secret_key == keys / "clients" / "node.key_secret"

    with Procs(tmp_path) as procs:
        assert procs.start("controller", python_module("dsi.cli.role", "--config", str(node))).wait_ready()
        # READY comes once the controller lists itself: no waiting
        assert main(["status", "--config", str(configs["operator"]), "--json"]) == 0
        [info] = json.loads(capsys.readouterr().out)["instances"]
        assert (info["instance_id"], info["state"]) == ("controller-0", "serving")
        address = re.search(r'controller = "([^"]+)"', base).group(1)
        assert main(["status", "--controller", address, "--timeout", "0.5"]) == 1  # no keys at all
        assert main(["status", "--config", str(configs["stranger"]), "--timeout", "0.5"]) == 1
        assert "cannot reach the controller" in capsys.readouterr().err
