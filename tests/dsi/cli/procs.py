"""Real dsi processes for the CLI tests: configs on free ports, start, READY, status, reaping.

Every process is started in its own session and registered with a ``Procs`` context manager,
whose exit SIGKILLs each one's process group, so no test leaves a process behind, and removes
the /dev/shm files the killed processes created.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from dsi.kvcache.shm import remove_files_of
from dsi.provision.forkserver import ENGINE_KINDS
from dsi.provision.process import role_environment
from dsi.transport.ports import free_port
from tests.dsi.cli.launcher import LaunchedProcess, Launcher

REPO_ROOT = Path(__file__).resolve().parents[3]
LOCAL_TOML = REPO_ROOT / "configs" / "local.toml"
# The tiny model the test clusters load; the first role that needs it generates it (under a lock).
SHARED_MODEL_DIR = REPO_ROOT / "run" / "models" / "tiny"
# The role processes a test starts share the machine's cores with each other and with the test's
# own reference engine: their torch OpenMP threads sleep while they wait instead of spinning, as
# under `dsi serve` (dsi.provision.process.role_environment). The test process keeps torch's
# default, which is faster for an engine running alone. Thread counts, and so every result bit,
# are unchanged.
CHILD_ENV = role_environment(os.environ)
READY_TIMEOUT_S = 60.0  # generous: the machine is shared and python imports are slow there

# "KeyError: ...", "vllm.x.SomeError: ...", with or without a log prefix before it
_EXCEPTION_LINE = re.compile(r"(?m)\b[\w.]*(?:Error|Exception|Failed|Interrupt)\b: .*$")


def local_config(
    tmp_path: Path, keep: Sequence[str] = (), interval_s: float = 0.5, source: Path = LOCAL_TOML
) -> Path:
    """`source` (configs/local.toml) with every 127.0.0.1 port replaced by a free one, paths under
    tmp_path, a faster heartbeat and, when `keep` names role ids, only those [[roles]]."""
    head, *blocks = source.read_text().split("[[roles]]")
    if keep:
        blocks = [b for b in blocks if re.search(r'(?m)^id = "([^"]+)"', b).group(1) in keep]  # type: ignore[union-attr]
    text = "[[roles]]".join([head, *blocks])
    ports: dict[str, int] = {}

    def fresh(match: re.Match[str]) -> str:
        return f"127.0.0.1:{ports.setdefault(match.group(1), free_port())}"

    text = re.sub(r"127\.0\.0\.1:(\d+)", fresh, text)
    text = text.replace('"../run/models/tiny"', f'"{SHARED_MODEL_DIR}"')  # generated once, shared
    text = text.replace('"../run/', f'"{tmp_path}/run/')
    text = re.sub(r"(?m)^heartbeat_interval_s = .*$", f"heartbeat_interval_s = {interval_s}", text)
    path = tmp_path / "local.toml"
    path.write_text(text)
    return path


def config_ids(path: Path) -> list[str]:
    return re.findall(r'(?m)^id = "([^"]+)"', path.read_text())


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def engine_role_args(argv: Sequence[str]) -> list[str] | None:
    """The ``dsi.cli.role`` arguments of `argv` where it runs only engine roles (prefill, decode)
    named with --role; None for any other command."""
    argv = list(argv)
    if argv[:3] != [sys.executable, "-m", "dsi.cli.role"]:
        return None
    args = argv[3:]
    ids = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--role"]
    configs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"]
    if not ids or len(configs) != 1:
        return None
    kinds = {role["id"]: role["kind"] for role in tomllib.loads(Path(configs[0]).read_text())["roles"]}
    return args if all(kinds.get(i) in ENGINE_KINDS for i in ids) else None


def parent_pid(pid: int) -> int:
    """``pid``'s parent process id (/proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


class Proc:
    """One child process; stdout is read for READY lines, stderr goes to `log_path`. An engine
    role's ``dsi.cli.role`` process started with the usual environment is forked by the suite's
    preloaded launcher (tests/dsi/cli/launcher.py) instead of starting a fresh interpreter."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.log_path = log_path
        self._out = b""
        args = engine_role_args(argv) if env is None else None
        if args is not None:
            launcher = Launcher.shared(REPO_ROOT, CHILD_ENV, log_path.with_name("role-launcher.log"))
            read, write = os.pipe()
            try:
                with open(log_path, "ab") as log:
                    pid = launcher.launch(args, write, log.fileno())
            finally:
                os.close(write)
            self.popen: subprocess.Popen | LaunchedProcess = LaunchedProcess(
                launcher, pid, os.fdopen(read, "rb", buffering=0), list(argv)
            )
            return
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(
                list(argv),
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env=CHILD_ENV if env is None else {**CHILD_ENV, **env},
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def read_line(self, timeout: float = READY_TIMEOUT_S) -> str:
        """The next stdout line; RuntimeError with the log when the process exits first."""
        deadline = time.monotonic() + timeout
        fd = self.popen.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._out:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no output line in {timeout}s; log: {self.log()}")
            if select.select([fd], [], [], remaining)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"exited with {self.popen.wait()} first; log: {self.log()}")
                self._out += chunk
        line, self._out = self._out.split(b"\n", 1)
        return line.decode()

    def wait_ready(self) -> str:
        line = self.read_line()
        if not line.startswith("READY"):
            raise RuntimeError(f"printed {line!r} instead of READY; log: {self.log()}")
        return line

    def signal(self, sig: signal.Signals) -> None:
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.popen.wait(timeout)

    def kill_group(self) -> None:
        """SIGKILL the process and everything in its process group; reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()

    def log(self) -> str:
        """The log's tail, after the head of its first traceback and every exception line (a
        role's root cause is often far above the shutdown lines that end the log, and vLLM
        prefixes each traceback line, so the exception's own line is what names the cause)."""
        text = self.log_path.read_text(errors="replace")
        tail = text[-3000:]
        first = text.find("Traceback (most recent call last)")
        if first < 0 or first >= len(text) - len(tail):
            return tail
        causes = list(dict.fromkeys(m.group(0) for m in _EXCEPTION_LINE.finditer(text)))[:20]
        return (
            f"first traceback:\n{text[first : first + 1500]}\n...\n"
            f"exception lines:\n" + "\n".join(causes) + f"\n...\n{tail}"
        )


class Procs:
    """The processes of one test; leaving the block SIGKILLs every one's process group, and the
    adopted pids (grandchildren in sessions of their own, such as the roles of ``dsi serve``)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[Proc] = []
        self.adopted: list[int] = []

    def adopt(self, pids: Iterable[int]) -> None:
        self.adopted.extend(pids)

    def start(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        """``env``: variables set for this process beside the children's usual environment."""
        proc = Proc(argv, self.log_dir / f"{name}-{len(self.procs)}.log", env)
        self.procs.append(proc)
        return proc

    def __enter__(self) -> Procs:
        return self

    def __exit__(self, *_exc: object) -> None:
        for proc in reversed(self.procs):
            proc.kill_group()
            remove_files_of(proc.pid)  # a killed role leaves its /dev/shm files behind
        for pid in self.adopted:
            if not gone(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        for pid in self.adopted:
            while not gone(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            remove_files_of(pid)


def dsi_status(*args: str, prefix: Sequence[str] = (), timeout: float = 30.0) -> subprocess.CompletedProcess:
    """``dsi status ARGS`` (optionally under a prefix such as ``ip netns exec NS``)."""
    argv = [*prefix, *python_module("dsi.cli.main", "status", *args)]
    return subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def instances(*args: str, prefix: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """The controller's instances by id, as ``dsi status --json`` lists them: read in this process
    (in a thread of its own, so callers may be inside an event loop) unless ``prefix`` runs the
    command elsewhere. Tests poll this often; a process of its own costs a second of CPU a call."""
    if not prefix:
        return {info["instance_id"]: info for info in _instances_here(args)}
    done = dsi_status("--json", *args, prefix=prefix)
    if done.returncode != 0:
        raise AssertionError(f"dsi status exited {done.returncode}: {done.stderr}")
    return {info["instance_id"]: info for info in json.loads(done.stdout)["instances"]}


def _instances_here(args: Sequence[str]) -> list[dict[str, Any]]:
    """The instances ``dsi status --json ARGS`` prints, read by its own client in a thread of this
    process (AssertionError when the controller cannot be reached)."""
    from dsi.cli.status import (
        ControllerUnreachable,
        add_controller_args,
        controller_target,
        fetch_instances,
        table_json,
    )

    parser = argparse.ArgumentParser()
    add_controller_args(parser)
    parsed = parser.parse_args(list(args))
    address, keys = controller_target(parsed.config, parsed.controller)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            table = pool.submit(asyncio.run, fetch_instances(address, keys, parsed.timeout)).result()
        except ControllerUnreachable as exc:
            raise AssertionError(f"dsi status: {exc}") from None
    return json.loads(json.dumps(table_json(table)))["instances"]  # as the command prints them


def wait_until(check: Callable[[], Any], timeout: float = 30.0, every: float = 0.3) -> Any:
    """The first truthy result of `check`; AssertionError with the last result after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result or time.monotonic() > deadline:
            break
        time.sleep(every)
    if not result:
        raise AssertionError(f"condition not met in {timeout}s")
    return result


def gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie waiting for its parent)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
