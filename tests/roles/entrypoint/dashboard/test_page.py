"""/dashboard in a real browser: headless Chromium against a live ``dsi serve``.

The page lists every instance of the serve, and after ``dsi drain decode-1`` it shows that
instance draining; a screenshot of it is written to the test's directory (and copied to
$DSI_SCREENSHOT_DIR when that is set) and checked to be a picture, not a blank page.
Skipped where Chromium is not installed (Debian: ``apt-get install chromium``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from tests.dsi.cli.procs import (
    REPO_ROOT,
    Procs,
    config_ids,
    free_port,
    gone,
    instances,
    local_config,
    python_module,
    wait_until,
)
from tests.dsi.cli.test_serve_cli import chat

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)"
    ),
]
ROLES = ("controller-0", "entrypoint-0", "prefill-0", "decode-0", "decode-1", "kvstore-0", "balancer-0")
WINDOW = (1280, 1400)


class _Page(HTMLParser):
    """The dumped DOM's instance rows ({id: state}), render count and connection label."""

    def __init__(self, dom: str) -> None:
        super().__init__()
        self.rows: dict[str, str] = {}
        self.renders = 0
        self.conn = ""
        self._in_conn = False
        self.feed(dom)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-instance"):
            self.rows[a["data-instance"]] = a.get("data-state") or ""
        elif tag == "body":
            self.renders = int(a.get("data-renders") or 0)
        self._in_conn = a.get("id") == "conn"

    def handle_endtag(self, tag: str) -> None:
        self._in_conn = False

    def handle_data(self, data: str) -> None:
        if self._in_conn:
            self.conn += data


def chromium(url: str, tmp_path: Path, *args: str, timeout: float = 90.0) -> str:
    """Headless Chromium on ``url`` with ``args`` (--dump-dom, --screenshot=...): its stdout. The
    page runs 4 s of virtual time first (about three polls); every process it started is killed
    when it returns."""
    assert CHROMIUM is not None
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",  # tests may run as root
        "--disable-gpu",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
        "--virtual-time-budget=4000",
        *args,
        url,
    ]
    with open(tmp_path / "chromium.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, (tmp_path / "chromium.log").read_text()[-2000:]
    return out.decode()


def check_screenshot(path: Path) -> None:
    """A PNG of the window's size that is a picture: tens of KB, and many colours (a blank or
    unstyled page has a handful)."""
    assert path.stat().st_size > 20_000, path.stat().st_size
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == WINDOW
        colours = image.convert("RGB").getcolors(maxcolors=256)
    assert colours is None, f"only {len(colours)} colours: a blank page?"  # None: more than 256


def test_the_dashboard_lists_every_instance_and_shows_a_drain(procs: Procs, tmp_path: Path) -> None:
    config = local_config(tmp_path, keep=ROLES)
    port = free_port()
    server = procs.start(
        "serve", python_module("dsi.cli.main", "serve", "--config", str(config), "--port", str(port))
    )
    assert server.read_line().startswith(f"dsi serve: gateway http://127.0.0.1:{port}")
    ids = config_ids(config)
    procs.adopt(info["pid"] for info in instances("--config", str(config)).values())
    chat(port, max_tokens=6)  # a request, so that the latency tiles and charts have one
    url = f"http://127.0.0.1:{port}/dashboard"

    page = _Page(chromium(url, tmp_path, "--dump-dom"))
    assert page.renders >= 1 and page.conn == "live", (page.renders, page.conn)
    assert page.rows == dict.fromkeys(ids, "serving")

    drained = subprocess.run(
        python_module("dsi.cli.main", "drain", "decode-1", "--grace", "120", "--config", str(config)),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert drained.returncode == 0, drained.stderr

    def drained_on_the_page() -> dict[str, str] | None:
        rows = _Page(chromium(url, tmp_path, "--dump-dom")).rows
        return rows if rows.get("decode-1", "draining") == "draining" else None

    rows = wait_until(drained_on_the_page, timeout=30, every=0.5)  # draining, or already gone
    assert rows.pop("decode-1", "draining") == "draining"
    assert rows == {iid: "serving" for iid in ids if iid != "decode-1"}

    shot = tmp_path / "dashboard.png"
    chromium(url, tmp_path, f"--screenshot={shot}")
    check_screenshot(shot)
    if os.environ.get("DSI_SCREENSHOT_DIR"):
        keep = Path(os.environ["DSI_SCREENSHOT_DIR"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, keep / shot.name)

    pids = [info["pid"] for info in instances("--config", str(config)).values()]
    server.signal(signal.SIGINT)
    assert server.wait(60) == 0
    wait_until(lambda: all(gone(pid) for pid in pids), timeout=15)
