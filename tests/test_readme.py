"""The README and docs/ stay true: the README is short, every relative link resolves, every
command and make target the README names exists, the cheap commands it shows run, and each heavy
one (a cluster, an HTTP call, an SDK call) is covered by a named test that exists."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dsi.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 200

# Cheap README commands, run here: the README text that names each -> the arguments of `dsi`
# ({tmp} is a temporary folder). Order matters: `keys show` reads what `keys create` wrote.
CHEAP = {
    "dsi --help": ["--help"],
    "dsi keys create --out DIR": ["keys", "create", "--out", "{tmp}/keys"],
    "dsi keys show DIR": ["keys", "show", "{tmp}/keys"],
    "dsi keys create --out /etc/dsi/keys": ["keys", "create", "--out", "{tmp}/etc-keys"],
    "dsi config docs": ["config", "docs"],
    "dsi recipe render --protocol chat": ["recipe", "render", "--protocol", "chat"],
}
RENDER_REQUEST = {"model": "dsi-tiny", "messages": [{"role": "user", "content": "Hello"}]}

# Heavy README commands (a cluster, HTTP against it, an SDK, the suite itself): the README text
# that names each -> the tests that cover it, each with a string the test file must contain.
HEAVY: dict[str, list[tuple[str, str]]] = {
    "make serve": [("tests/dsi/cli/test_serve_cli.py", '"serve", "--config"')],
    "make test": [("tests/conftest.py", "def procs")],  # `make test` runs this suite
    "make serve CONFIG=configs/smollm2.toml": [("tests/roles/test_llama_cluster.py", "smollm2.toml")],
    "make serve CONFIG=configs/vllm.toml": [("tests/roles/vllm/test_vllm_cluster.py", "vllm.toml")],
    "curl -s http://127.0.0.1:8000/v1/chat/completions": [
        ("tests/dsi/cli/test_serve_cli.py", "/v1/chat/completions")
    ],
    "curl -s http://127.0.0.1:8000/health": [("tests/roles/entrypoint/test_health.py", "/health")],
    'openai.OpenAI(base_url="http://127.0.0.1:8000/v1"': [
        ("tests/roles/entrypoint/test_sdk_clients.py", "openai.OpenAI(base_url="),
        ("tests/roles/vllm/test_vllm_cluster.py", "OpenAI(base_url="),
    ],
    "dsi serve": [("tests/dsi/cli/test_serve_cli.py", '"serve"')],
    "dsi-role --config": [("tests/dsi/cli/test_role_cli.py", "dsi.cli.role")],
    "dsi status": [("tests/dsi/cli/test_status_cli.py", "status")],
    "dsi drain INSTANCE": [("tests/roles/test_drain_cluster.py", "drain")],
    "dsi undrain INSTANCE": [("tests/roles/controller/test_controller_drain.py", "undrain")],
    "dsi scale ROLE": [("tests/dsi/cli/test_scale_cli.py", "scale")],
    "dsi generate --model": [("tests/dsi/cli/test_generate_cli.py", "generate")],
    "dsi model init": [("tests/dsi/model/test_model_files.py", '"init"')],
    "dsi sim validate": [("tests/dsi/cli/test_sim_validate_cli.py", "validate")],
    "dsi sim experiment": [("tests/dsi/sim/test_experiments.py", "experiment")],
}

_FENCE = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
_INLINE = re.compile(r"`([^`\n]+)`")
_COMMENT = re.compile(r"<!--.*?-->", re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_DSI = re.compile(r"(?<![\w./-])dsi ([a-z][\w-]*)(?: ([a-z][\w|-]*))?")
_MAKE = re.compile(r"(?<![\w-])make ([a-z][\w-]*)")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code(markdown: str) -> list[str]:
    """The code of a Markdown text: every fenced block, then every inline code span outside them."""
    blocks = [body for _, body in _FENCE.findall(markdown)]
    prose = _FENCE.sub("", _COMMENT.sub("", markdown))
    return blocks + _INLINE.findall(prose)


def _shell_lines(markdown: str) -> list[str]:
    """The command lines of the ```sh blocks, continuation lines joined, comments dropped."""
    lines = []
    for lang, body in _FENCE.findall(markdown):
        if lang not in ("sh", "bash", "shell"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(re.sub(r"\s+", " ", line))
    return lines


def _docs() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", _text(path)).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def _dsi() -> list[str]:
    script = Path(sys.executable).parent / "dsi"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dsi.cli.main"]


def test_readme_is_short():
    lines = _text(README).count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_starts_with_make_serve_and_make_test():
    first = _FENCE.search(_text(README))
    assert first is not None and first.start() < 20, "the README opens with its quick-start block"
    commands = [line.split()[:2] for line in _shell_lines(first.group(0))]
    assert commands[:2] == [["make", "serve"], ["make", "test"]]


def test_every_relative_link_resolves():
    broken = []
    for path in _docs():
        text = _COMMENT.sub("", _FENCE.sub("", _text(path)))
        for target in _LINK.findall(_INLINE.sub("", text)):
            if re.match(r"[a-z][\w+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}: {target}"
            if not resolved.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
                broken.append(f"{where} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_dsi_command_the_readme_names_exists():
    commands = _subcommands(build_parser())
    missing = []
    for code in _code(_text(README)):
        for first, second in _DSI.findall(code):
            if first not in commands:
                missing.append(f"dsi {first}")
                continue
            nested = _subcommands(commands[first])
            for name in second.split("|") if (second and nested) else ():
                if name and name not in nested:
                    missing.append(f"dsi {first} {name}")
    assert not missing, f"the README names commands dsi lacks: {sorted(set(missing))}"


def test_dsi_role_is_an_installed_script():
    assert "dsi-role" in _text(README)
    scripts = tomllib.loads(_text(ROOT / "pyproject.toml"))["project"]["scripts"]
    assert scripts["dsi-role"] == "dsi.cli.role:main"


def test_every_make_target_the_readme_names_exists():
    makefile = _text(ROOT / "Makefile")
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", makefile, re.M))
    named = {t for code in _code(_text(README)) for t in _MAKE.findall(code)}
    assert named, "the README names no make target"
    assert named <= targets, f"the README names make targets the Makefile lacks: {sorted(named - targets)}"


def test_every_readme_shell_line_is_run_here_or_covered_by_a_test():
    known = [*CHEAP, *HEAVY]
    uncovered = [line for line in _shell_lines(_text(README)) if not any(line.startswith(k) for k in known)]
    assert not uncovered, f"README commands neither run here nor mapped to a test: {uncovered}"


@pytest.mark.parametrize("command", sorted(HEAVY))
def test_heavy_readme_commands_are_covered_by_existing_tests(command):
    assert command in _text(README), f"{command!r} is no longer in the README: drop it from HEAVY"
    for test_file, needle in HEAVY[command]:
        path = ROOT / test_file
        assert path.is_file(), f"{test_file}, which covers {command!r}, does not exist"
        assert needle in _text(path), f"{test_file} no longer contains {needle!r} ({command!r})"


def test_cheap_readme_commands_run(tmp_path):
    readme = _text(README)
    registered = _subcommands(build_parser())
    for command, args in CHEAP.items():
        if command not in readme:
            continue  # the README no longer shows it
        if len(args) > 1 and args[0] not in registered:
            pytest.fail(f"the README shows {command!r}, and dsi has no {args[0]!r} command")
        argv = _dsi() + [a.replace("{tmp}", str(tmp_path)) for a in args]
        stdin = json.dumps(RENDER_REQUEST) if args[:2] == ["recipe", "render"] else None
        done = subprocess.run(argv, cwd=tmp_path, input=stdin, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr[-2000:]}"
        assert done.stdout.strip(), f"{command} printed nothing"
    if "dsi keys create" in readme:
        created = (tmp_path / "keys" / "server.key_secret").stat().st_mode & 0o777
        assert created == 0o600
