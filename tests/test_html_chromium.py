"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``) loads it from file:// and the test
watches over the DevTools protocol that no request leaves the page and no console error or exception appears,
for a recorded run and for a store full of hostile strings (``<img src=http://...>``, ``<script>``).

The DevTools client is a few lines over ``--remote-debugging-pipe`` (JSON messages separated by NUL on fds 3 and
4): no websocket package and no port. ``make test`` installs chromium when /usr/bin/chromium is missing, beside the
tests (Makefile, ``chromium``), and these tests wait for that install; without chromium they are skipped, saying so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from test_hostile_strings import FIELDS, HOSTILE, record

from profiler.analysis import summarize
from profiler.core.store import load_run
from profiler.render.html import write_html

CHROMIUM = Path("/usr/bin/chromium")
INSTALL_LOG = ROOT / ".chromium-install.log"  # `make chromium` holds a lock on it while apt installs chromium
INSTALL_WAIT_S = 600.0
RUNS = Path(__file__).parent / "data" / "runs"
TIMEOUT_S = 30.0


def wait_for_install(log: Path, deadline_s: float) -> bool:
    """Wait until no install holds the lock on ``log`` (``make chromium``); False if one still did at the deadline."""
    if not log.exists():
        return True
    deadline = time.monotonic() + deadline_s
    with log.open("rb") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
            else:
                fcntl.flock(f, fcntl.LOCK_UN)
                return True


@pytest.fixture(scope="module")
def chromium() -> None:
    """Chromium, once the install ``make test`` started beside the tests has ended; else the tests are skipped."""
    if CHROMIUM.exists():
        return
    if not wait_for_install(INSTALL_LOG, INSTALL_WAIT_S):
        pytest.skip(f"chromium's install ({INSTALL_LOG.name}) was still running after {INSTALL_WAIT_S:.0f} s")
    if not CHROMIUM.exists():
        tail = INSTALL_LOG.read_text(errors="replace").strip().splitlines()[-1:] if INSTALL_LOG.exists() else []
        pytest.skip(
            f"{CHROMIUM} is missing (`make test` installs Debian's chromium package){''.join(': ' + t for t in tail)}"
        )


class DevTools:
    """A DevTools-protocol client over Chromium's debugging pipe: ``call`` waits for its answer and keeps every
    event that arrives meanwhile in ``events``."""

    def __init__(self, profile: Path) -> None:
        to_child_r, self._w = os.pipe()
        self._r, from_child_w = os.pipe()

        def fds() -> None:  # the child reads commands on fd 3 and writes answers and events on fd 4
            os.dup2(to_child_r, 3)
            os.dup2(from_child_w, 4)

        flags = (
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-default-apps", "--disable-extensions", "--no-default-browser-check",
            f"--user-data-dir={profile}", "--remote-debugging-pipe", "about:blank",
        )  # fmt: skip
        self.proc = subprocess.Popen(
            [str(CHROMIUM), *flags],
            preexec_fn=fds,  # noqa: PLW1509 - dup2 only, before exec
            pass_fds=(3, 4),  # kept open through exec (fds are closed after preexec_fn)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self._buf = b""
        self._next = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        self._next += 1
        msg: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            for m in self._read(deadline):
                if m.get("id") == self._next:
                    assert "error" not in m, f"{method}: {m['error']}"
                    return dict(m.get("result", {}))
                self.events.append(m)

    def wait_for(self, method: str, timeout: float = TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events += self._read(deadline)

    def settle(self, seconds: float) -> None:
        """Collect events for ``seconds`` more (a late request or error of the page)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            self.events += self._read(deadline + TIMEOUT_S)

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            assert left > 0, "chromium did not answer in time"
            ready, _, _ = select.select([self._r], [], [], left)
            if ready:
                chunk = os.read(self._r, 1 << 16)
                assert chunk, f"chromium closed the pipe (exit {self.proc.poll()})"
                self._buf += chunk
        *msgs, self._buf = self._buf.split(b"\0")
        return [json.loads(m) for m in msgs]

    def close(self) -> None:
        with contextlib.suppress(AssertionError):  # it may close the pipe before it answers
            self.call("Browser.close")
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)


@pytest.fixture(scope="module")
def browser(chromium: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    dt = DevTools(tmp_path_factory.mktemp("chromium-profile"))
    try:
        yield dt
    finally:
        dt.close()


def load_page(dt: DevTools, page: Path) -> list[dict[str, Any]]:
    """Open ``page`` in a fresh tab with Network, Runtime and Log on; the events it caused."""
    target = dt.call("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = dt.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Network", "Runtime", "Log", "Page"):
        dt.call(f"{domain}.enable", session=session)
    dt.events.clear()
    dt.call("Page.navigate", {"url": page.as_uri()}, session=session)
    dt.wait_for("Page.loadEventFired")
    dt.settle(0.5)
    title = dt.call("Runtime.evaluate", {"expression": "document.title"}, session=session)["result"]["value"]
    events = [e for e in dt.events if e.get("sessionId") == session]
    dt.call("Target.closeTarget", {"targetId": target})
    assert title.startswith("stallscope report"), f"the page did not load as the report: title {title!r}"
    return events


def problems(events: list[dict[str, Any]], page: Path) -> list[str]:
    out = []
    for e in events:
        method, p = e.get("method"), e.get("params", {})
        if method == "Network.requestWillBeSent" and p["request"]["url"] != page.as_uri():
            out.append(f"request {p['request']['url']}")
        elif method == "Runtime.exceptionThrown":
            out.append(f"exception {p['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert", "warning"):
            out.append(f"console.{p['type']} {p.get('args')}")
        elif method == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
            out.append(f"log {p['entry']['level']}: {p['entry']['text']}")
    return out


def test_report_loads_nothing(browser: DevTools, tmp_path: Path) -> None:
    """A recorded run's report: the page itself is the only request, and no console error appears."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "cpu-workers", run)
    rec = load_run(run)
    page = write_html(summarize(rec), rec, tmp_path / "report.html")
    events = load_page(browser, page)
    assert [e for e in events if e.get("method") == "Network.requestWillBeSent"], "no request seen: not watching"
    assert problems(events, page) == []


def test_hostile_report_runs_and_fetches_nothing(browser: DevTools, tmp_path: Path) -> None:
    """A store whose names and error hold <img src=http://...> and <script>: nothing is fetched or run."""
    hostile = dict(zip(FIELDS, HOSTILE, strict=False))
    hostile["scenario"] = "<img src=http://127.0.0.1:9/s.png><script>console.error('ran')</script>"
    hostile["error"] = "<script>fetch('http://127.0.0.1:9/e')</script><img src=http://127.0.0.1:9/e.png>"
    rec = load_run(record(tmp_path, hostile))
    page = write_html(summarize(rec), rec, tmp_path / "hostile.html")
    assert problems(load_page(browser, page), page) == []


def test_a_leak_would_be_seen(browser: DevTools, tmp_path: Path) -> None:
    """The watch works: the same report with one <img src=http://...> left unescaped is caught (the CSP blocks
    the fetch and Chromium logs it)."""
    run = tmp_path / "run"
    shutil.copytree(RUNS / "cpu-workers", run)
    rec = load_run(run)
    page = write_html(summarize(rec), rec, tmp_path / "leaky.html")
    page.write_text(page.read_text().replace("<footer>", "<footer><img src=http://127.0.0.1:9/leak.png>", 1))
    assert problems(load_page(browser, page), page), "an unescaped image went unnoticed"


def test_the_wait_lasts_while_the_install_holds_its_lock_within_its_deadline(tmp_path: Path) -> None:
    """The wait ``make chromium``'s lock asks for: none without an install, through an install (here a 1 s holder
    of the lock), and no longer than its deadline."""
    log = tmp_path / "install.log"
    assert wait_for_install(log, 0.0)  # no install started: nothing to wait for
    log.touch()
    holder = subprocess.Popen(["flock", str(log), "sleep", "1"])
    try:
        while wait_for_install(log, 0.0):  # a single try: until the holder has the lock
            time.sleep(0.01)
        assert not wait_for_install(log, 0.3)  # the deadline ends a wait on an install that has not ended
        assert wait_for_install(log, 30.0)
        assert holder.wait(5) == 0  # the holder had let go: its lock lasts as long as it runs
    finally:
        holder.kill()
