"""``dsi``'s command table: each module registers the command it is named for, and a command
imports only its own module."""

import subprocess
import sys

from dsi.cli.main import _COMMANDS, build_parser, command_of


def _commands(parser) -> set[str]:
    [sub] = [a for a in parser._actions if a.dest == "command"]
    return set(sub.choices)


def test_each_module_registers_the_command_it_is_named_for():
    assert command_of("dsi.cli.status") == "status" and command_of("dsi.bench.cli") == "bench"
    for module in _COMMANDS:
        assert _commands(build_parser(command_of(module))) == {command_of(module)}
    assert _commands(build_parser()) == {command_of(m) for m in _COMMANDS}  # --help lists them all
    assert _commands(build_parser("--help")) == {command_of(m) for m in _COMMANDS}


def test_dsi_status_does_not_import_the_benchmarks():
    code = (
        "import sys; from dsi.cli.main import build_parser; build_parser('status'); "
        "print(sorted(m for m in sys.modules if m.startswith('dsi.bench') or m == 'torch'))"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
