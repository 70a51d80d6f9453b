"""py-spy process handling: failure lines say why and how to fix it; a missing binary; py-spy's threads moved
to real-time scheduling once they are old enough (OnTime), or said to run at normal priority."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until

from profiler.core.sampling.pyspy import (
    FIFO_PRIORITY,
    PROMOTE_AFTER_S,
    OnTime,
    PySpyRecorder,
    attach_problem,
    find_pyspy,
)


@pytest.mark.parametrize(
    ("stderr", "needles"),
    [
        ("Error: Permission denied (os error 13)", ["ptrace_scope=0", "SYS_PTRACE", "root"]),
        ("Error: Operation not permitted (os error 1)", ["ptrace_scope=0", "SYS_PTRACE"]),
        ("Error: Failed to find python version from target process", ["no Python interpreter"]),
        ("Error: No such process (os error 3)", ["exited before py-spy could attach"]),
        ("", ["exited without output"]),
    ],
)
def test_attach_problems_say_why_and_how_to_fix(stderr: str, needles: list[str]) -> None:
    line = attach_problem(stderr)
    assert "\n" not in line
    for needle in needles:
        assert needle in line


def test_missing_pyspy_is_a_reason_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALLSCOPE_PYSPY", str(tmp_path / "no-such-py-spy"))
    rec = PySpyRecorder(pid=1, out=tmp_path / "out.json")
    problem = rec.start()
    assert problem is not None and "pip install py-spy" in problem
    assert rec.stop() == problem  # stopping a recorder that never started is harmless


def test_rate_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"allowed 1\.\.1000"):
        PySpyRecorder(pid=1, out=tmp_path / "x", rate=5000).start()


def test_on_time_promotes_each_thread_once_it_is_old_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int, int]] = []

    def setscheduler(tid: int, policy: int, param: os.sched_param) -> None:
        if tid == 13:
            raise ProcessLookupError(3, "No such process")  # a thread that ended between listing and promoting
        calls.append((tid, policy, param.sched_priority))

    monkeypatch.setattr(os, "sched_setscheduler", setscheduler)
    on = OnTime(pid=10)
    assert on.promote_due([10, 11], now=100.0) and calls == []  # just seen: py-spy may still be attaching
    assert on.promote_due([10, 11, 12, 13], now=100.0 + PROMOTE_AFTER_S)
    fifo = os.SCHED_FIFO | os.SCHED_RESET_ON_FORK  # threads a promoted thread starts begin at normal priority
    assert calls == [(10, fifo, FIFO_PRIORITY), (11, fifo, FIFO_PRIORITY)]
    assert on.promote_due([10, 11, 12], now=100.0 + 2 * PROMOTE_AFTER_S)
    assert calls[2:] == [(12, fifo, FIFO_PRIORITY)] and on.promoted == {10, 11, 12}
    assert on.scheduling.startswith(f"SCHED_FIFO {FIFO_PRIORITY}")


def test_on_time_without_the_privilege_says_normal_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(tid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    on = OnTime(pid=10)
    on.promote_due([10], now=0.0)
    assert on.promote_due([10], now=PROMOTE_AFTER_S) is False  # the watcher stops trying
    assert on.scheduling == "normal priority (SCHED_FIFO not allowed here: Operation not permitted)"


def _tids(pid: int) -> set[int]:
    return {int(t) for t in os.listdir(f"/proc/{pid}/task")}


# a stand-in for py-spy record: says it samples (or not), then waits for SIGINT (set here: a pytest-xdist worker
# ignores SIGINT, and a shell script could not take back an ignored signal), writes its output and exits 0
FAKE_PYSPY = """import os, signal, sys, time
def stop(*_):
    open(os.environ["FAKE_OUT"], "w").write("{}")
    sys.exit(0)
signal.signal(signal.SIGINT, stop)  # before it says it samples: the stop may come right after (as py-spy's)
if os.environ["FAKE_SAYS"] == "1":  # in one write: the stop may come as soon as the first line is read
    lines = ["py-spy> Sampling process 10 times a second. Press Control-C to exit."]
    for late in ("1.01s", "2.50s", "1.20s"):  # what py-spy prints, at most once a second, past 1 s behind
        lines.append(f"py-spy> {late} behind in sampling, results may be inaccurate. Try reducing the sampling rate")
    print("\\n".join(lines), flush=True)
while True:
    time.sleep(0.05)
"""


@pytest.mark.parametrize("says", [True, False])
def test_start_returns_once_pyspy_says_it_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, says: bool) -> None:
    """py-spy prints "Sampling process ..." on stdout once it has opened the process: start returns then, not at
    the end of its attach timeout (3 s for a command, 0.5 s for a scenario's run, before its first step). A
    py-spy that never says it is taken as attached at the timeout, as before."""
    fake = tmp_path / "py-spy"
    fake.write_text(f"#!{sys.executable}\n{FAKE_PYSPY}")
    fake.chmod(0o755)
    monkeypatch.setenv("STALLSCOPE_PYSPY", str(fake))
    monkeypatch.setenv("FAKE_SAYS", "1" if says else "0")
    monkeypatch.setenv("FAKE_OUT", str(tmp_path / "out.json"))
    rec = PySpyRecorder(pid=os.getpid(), out=tmp_path / "out.json")
    t0 = time.monotonic()
    assert rec.start(attach_timeout_s=4.0) is None, rec.problem
    took = time.monotonic() - t0
    try:
        assert took < 2.0 if says else took >= 4.0, took
    finally:
        assert rec.stop() is None, rec.problem
    # its stdout read to the end: how far behind its schedule it said it fell, for the estimate's note
    assert (rec.stdout.behind_s, rec.stdout.behind_reports) == ((2.5, 3) if says else (None, 0))


def test_a_recording_pyspys_threads_run_real_time_where_allowed(tmp_path: Path) -> None:
    if find_pyspy() is None:
        pytest.skip("py-spy is not installed")
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    rec = PySpyRecorder(pid=target.pid, out=tmp_path / "out.json", rate=50)
    try:
        assert rec.start(attach_timeout_s=0.5) is None, rec.problem
        assert rec.proc is not None and rec.on_time is not None
        proc, on_time = rec.proc, rec.on_time
        time.sleep(PROMOTE_AFTER_S + 0.6)
        # start returns once py-spy samples, and a thread is promoted from PROMOTE_AFTER_S old: given a few seconds
        # on a busy host (where promoting is not allowed, the first try says so and nothing is promoted)
        wait_until(lambda: not on_time.scheduling.startswith("SCHED") or on_time.promoted >= _tids(proc.pid), 5.0)
        tids = _tids(proc.pid)
        policies = {os.sched_getscheduler(t) & ~os.SCHED_RESET_ON_FORK for t in tids}
        try:  # whether this host lets this process use SCHED_FIFO at all
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(FIFO_PRIORITY))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            allowed = True
        except PermissionError:
            allowed = False
        if allowed:
            assert policies == {os.SCHED_FIFO} and rec.on_time.promoted == tids
            assert rec.on_time.scheduling.startswith("SCHED_FIFO")
        else:
            assert policies == {os.SCHED_OTHER} and rec.on_time.scheduling.startswith("normal priority")
    finally:
        rec.stop()
        target.kill()
        target.wait()
