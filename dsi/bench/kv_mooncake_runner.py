"""Mooncake's TCP transport for ``dsi bench kv-transfer``, run by the Python of Mooncake's own venv.

Standard library and ``mooncake`` only: this file is run as a script by another interpreter
(dsi.bench.kv_mooncake made its venv), never imported by dsi. Two processes::

    bench (dsi's venv)          sender: this script                 receiver: this script --receive
      JSON line on stdin  ───►   TransferEngine, sources    ─tcp─►   TransferEngine, one buffer
      JSON line on stdout ◄───   per request, one answer             (its own stdin/stdout: the sender)

The sender's requests, one JSON object per line, each answered with one line::

    {"op": "start", "cases": [[parts, part_bytes], ...]}   {"ok": true, "version": "0.3.13.post1"}
    {"op": "write", "case": i}      all parts of case i, back to back at the start of the
                                    receiver's buffer; {"ok": true, "seconds": s} (timed here)
    ..., "verify": true}            also "equal": whether the receiver now holds the source's bytes
    {"op": "stop"}                  {"ok": true}, then both processes exit

A failure is answered ``{"ok": false, "reason": "..."}`` and the sender exits: the reason says
what failed (an import, ``initialize``, ``register_memory``, a write's return code). Every source
is random bytes, made once at start; a write of many parts is one ``batch_transfer_sync_write``,
of one part ``transfer_sync_write``: both return once the receiver holds the bytes.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from typing import Any, TextIO

_HOST = "127.0.0.1"
_PACKAGES = ("mooncake-transfer-engine-non-cuda", "mooncake-transfer-engine")


class Failed(Exception):
    """A step that failed; its message is the answer's ``reason``."""


def _engine() -> Any:
    try:
        from mooncake.engine import TransferEngine
    except Exception as error:  # ImportError, or a native library it needs missing (OSError)
        raise Failed(f"mooncake transfer engine not importable: {type(error).__name__}: {error}") from None
    engine = TransferEngine()
    rc = engine.initialize(_HOST, "P2PHANDSHAKE", "tcp", "")
    if rc != 0:
        raise Failed(
            f"mooncake TransferEngine.initialize({_HOST!r}, 'P2PHANDSHAKE', 'tcp', '') returned {rc}"
        )
    return engine


def _version() -> str:
    for name in _PACKAGES:
        try:
            return f"{name} {metadata.version(name)}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"


def _buffer(engine: Any, nbytes: int) -> ctypes.Array:
    """[nbytes] bytes registered with ``engine``."""
    buffer = (ctypes.c_ubyte * nbytes)()
    rc = engine.register_memory(ctypes.addressof(buffer), nbytes)
    if rc != 0:
        raise Failed(f"mooncake register_memory of {nbytes} bytes returned {rc}")
    return buffer


def _digest(buffer: ctypes.Array, nbytes: int) -> str:
    return hashlib.sha256(memoryview(buffer).cast("B")[:nbytes]).hexdigest()


def _answer(out: TextIO, reply: dict[str, Any]) -> None:
    out.write(json.dumps(reply) + "\n")
    out.flush()


# ---- receiver -------------------------------------------------------------------------------------
def receive(lines: TextIO, out: TextIO) -> None:
    """``{"nbytes": n}`` -> ``{"ok", "session", "address"}``; then ``{"op": "digest", "nbytes"}``
    -> ``{"ok", "sha256"}`` until ``{"op": "stop"}`` or the end of input."""
    try:
        nbytes = int(json.loads(lines.readline())["nbytes"])
        engine = _engine()
        buffer = _buffer(engine, nbytes)
        session = f"{_HOST}:{engine.get_rpc_port()}"
        _answer(out, {"ok": True, "session": session, "address": ctypes.addressof(buffer)})
    except Failed as error:
        _answer(out, {"ok": False, "reason": f"receiver: {error}"})
        return
    for line in lines:
        request = json.loads(line)
        if request.get("op") != "digest":
            break
        _answer(out, {"ok": True, "sha256": _digest(buffer, int(request["nbytes"]))})


# ---- sender ---------------------------------------------------------------------------------------
class Sender:
    """The sending engine, one registered source per case, and the receiver process."""

    def __init__(self, cases: list[tuple[int, int]]) -> None:
        if not cases or any(parts < 1 or part_bytes < 1 for parts, part_bytes in cases):
            raise Failed(f"cases must be [[parts, part_bytes], ...] of positive sizes, not {cases}")
        self.cases = cases
        self._receiver: subprocess.Popen | None = None
        self._engine = _engine()
        self._sources = []
        for parts, part_bytes in cases:
            source = _buffer(self._engine, parts * part_bytes)
            ctypes.memmove(source, os.urandom(parts * part_bytes), parts * part_bytes)
            self._sources.append(source)
        self._receiver = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--receive"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started = self._ask({"nbytes": max(parts * part_bytes for parts, part_bytes in cases)})
        self._session, self._remote = started["session"], int(started["address"])

    def write(self, case: int) -> float:
        parts, part_bytes = self.cases[case]
        source = ctypes.addressof(self._sources[case])
        started = time.perf_counter()
        if parts == 1:
            rc = self._engine.transfer_sync_write(self._session, source, self._remote, part_bytes)
        else:
            at = [i * part_bytes for i in range(parts)]
            rc = self._engine.batch_transfer_sync_write(
                self._session, [source + a for a in at], [self._remote + a for a in at], [part_bytes] * parts
            )
        seconds = time.perf_counter() - started
        if rc != 0:
            raise Failed(f"mooncake write of case {case} ({parts} x {part_bytes} bytes) returned {rc}")
        return seconds

    def verify(self, case: int) -> bool:
        """Whether the receiver holds case ``case``'s bytes (true right after its write)."""
        parts, part_bytes = self.cases[case]
        theirs = self._ask({"op": "digest", "nbytes": parts * part_bytes})["sha256"]
        return theirs == _digest(self._sources[case], parts * part_bytes)

    def close(self) -> None:
        if self._receiver is None:
            return
        try:
            self._receiver.communicate(json.dumps({"op": "stop"}) + "\n", timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            self._receiver.kill()
            self._receiver.wait()

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self._receiver is not None and self._receiver.stdin and self._receiver.stdout
        self._receiver.stdin.write(json.dumps(request) + "\n")
        self._receiver.stdin.flush()
        line = self._receiver.stdout.readline()
        if not line:
            raise Failed(f"the receiver process exited (code {self._receiver.wait()}) without an answer")
        reply = json.loads(line)
        if not reply["ok"]:
            raise Failed(reply["reason"])
        return reply


def send(lines: TextIO, out: TextIO) -> None:
    """Serve the bench's requests (see the module's docstring) until ``stop`` or the end of input."""
    sender: Sender | None = None
    try:
        for line in lines:
            request = json.loads(line)
            op = request.get("op")
            if op == "start" and sender is None:
                sender = Sender([(int(p), int(b)) for p, b in request["cases"]])
                _answer(out, {"ok": True, "version": _version()})
            elif op == "write" and sender is not None:
                case = int(request["case"])
                reply = {"ok": True, "seconds": sender.write(case)}
                if request.get("verify"):
                    reply["equal"] = sender.verify(case)
                _answer(out, reply)
            elif op == "stop":
                _answer(out, {"ok": True})
                return
            else:
                raise Failed(f"unexpected request {request} (start first, once; then write, stop)")
    except (Failed, KeyError, ValueError, TypeError, IndexError) as error:
        reason = str(error) if isinstance(error, Failed) else f"bad request: {type(error).__name__}: {error}"
        _answer(out, {"ok": False, "reason": reason})
    finally:
        if sender is not None:
            sender.close()


if __name__ == "__main__":
    # Mooncake's native code logs to stdout as well: the answers go to a copy of the original
    # stdout, and everything else written to file descriptor 1 goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    (receive if sys.argv[1:] == ["--receive"] else send)(sys.stdin, answers)
