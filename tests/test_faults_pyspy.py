"""py-spy missing, failing to attach, or SIGKILLed mid-run: the run completes on the sampler alone, says so in
one line when it happens, and the report says so too; the store stays sound (issue #13)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from conftest import ROOT, wait_until

from profiler.cli import main
from profiler.core.recorders.in_thread import ThreadRecorder
from profiler.core.store import integrity_ok, load_run
from profiler.runs.summarize import summarize_run

KILLED = "(killed by SIGKILL); its stack samples are lost"
BUSY_UNTIL_KILLED = """import os, sys, time
end = time.time() + 60
while time.time() < end and not os.path.exists(sys.argv[1]):
    sum(range(1000))
end = time.time() + 2
while time.time() < end:
    sum(range(1000))
"""


def _pyspy_under(pid: int) -> psutil.Process | None:
    try:
        return next((k for k in psutil.Process(pid).children(recursive=True) if k.name() == "py-spy"), None)
    except psutil.NoSuchProcess:
        return None


def _kill_pyspy_of(pid: int, after_s: float) -> None:
    """SIGKILL the py-spy under ``pid`` once it has run ``after_s`` seconds (past its attach window)."""
    spies: list[psutil.Process] = []
    assert wait_until(lambda: bool(spies.append(s) if (s := _pyspy_under(pid)) else None) or bool(spies), 60)
    spy = spies[0]
    assert wait_until(lambda: time.time() - spy.create_time() > after_s, timeout=30)
    os.kill(spy.pid, signal.SIGKILL)


def _run_and_kill_pyspy(
    args: list[str], killed: Path | None = None
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run ``stallscope ARGS``, SIGKILL its py-spy past the attach window, then (``killed``) touch that file."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "profiler", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        _kill_pyspy_of(proc.pid, after_s=3.3)  # zero-code gives py-spy 3 s to attach
        if killed is not None:
            killed.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), json.loads(out)


def _reported(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, dict[str, Any]]:
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert main(["report", str(out), "--json"]) == 0
    return text, json.loads(capsys.readouterr().out)


def _one_line_about_pyspy(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if "py-spy" in line]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


def test_pyspy_killed_mid_zero_code_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # busy until py-spy was killed, then 2 s more: the kill falls mid-run however late a loaded host starts py-spy
    # (a script of a fixed 5 s was killed at 4.75 s beside two busy processes, its host samples ending at 5.06 s)
    killed = tmp_path / "killed"
    script = tmp_path / "busy.py"
    script.write_text(BUSY_UNTIL_KILLED)
    out = tmp_path / "run"
    res, summary = _run_and_kill_pyspy(
        ["run", "--json", "--no-live", "--out", str(out), "--", sys.executable, str(script), str(killed)], killed
    )
    assert res.returncode == 0, res.stderr
    line = _one_line_about_pyspy(res.stderr)
    assert KILLED in line and line.endswith("the run goes on with the host and NVML sampler only"), line
    assert summary["status"] == "complete" and summary["stack_estimate"] is None
    assert integrity_ok(out)
    rec = load_run(out)
    killed_at = next(t for t, kind, src, msg in rec.events if src == "pyspy" and KILLED in msg)
    assert 0 < killed_at < max(t for t, src, _m, _v in rec.samples if src == "host") - 1.0  # host went on
    text, js = _reported(out, capsys)
    note = next(n for n in js["notes"] if n.startswith("py-spy stopped at"))
    assert note == (
        f"py-spy stopped at {killed_at:.1f} s {KILLED}: no stall estimate or loader attribution from py-spy's "
        "stacks; the run went on with the sampler alone"
    )
    assert f"py-spy stopped at {killed_at:.1f} s (killed by SIGKILL)" in text


def test_pyspy_killed_mid_instrumented_run_with_attribution(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The path of ``stallscope run SCENARIO --workers N`` (the runner's own ThreadRecorder and template), in this
    process: py-spy on this process, SIGKILLed mid-run."""
    said: list[str] = []
    out = tmp_path / "run"
    rec = ThreadRecorder(out, meta={}, sample_hz=20, warn=said.append, summarize=summarize_run)
    rec.start()
    assert (
        rec.start_pyspy(os.getpid(), rate=10, attach_timeout_s=0.5, unavailable="no loader attribution: {problem}")
        is None
    )
    _kill_pyspy_of(os.getpid(), after_s=0.7)
    assert wait_until(lambda: bool(said), timeout=10)
    samples = rec.sampler.stats.samples if rec.sampler else 0
    assert wait_until(lambda: rec.sampler is not None and rec.sampler.stats.samples >= samples + 5, timeout=10)
    summary = rec.close("complete")
    assert len(said) == 1 and said[0].startswith("no loader attribution: py-spy stopped at") and KILLED in said[0]
    assert summary is not None and summary.status == "complete" and summary.loader_attribution is None
    assert integrity_ok(out)
    _text, js = _reported(out, capsys)
    assert any(n.startswith("py-spy stopped at") and "no loader attribution" in n for n in js["notes"]), js["notes"]


@pytest.mark.parametrize(
    ("exe", "problem"),
    [("no-such-py-spy", "py-spy is not installed"), ("/bin/false", "py-spy exited without output")],
    ids=["missing", "fails-to-attach"],
)
def test_pyspy_missing_or_failing_to_attach_is_said_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], exe: str, problem: str
) -> None:
    monkeypatch.setenv("STALLSCOPE_PYSPY", exe if exe.startswith("/") else str(tmp_path / exe))
    said: list[str] = []
    out = tmp_path / "run"
    rec = ThreadRecorder(out, meta={"mode": "zero-code"}, sample_hz=20, warn=said.append, summarize=summarize_run)
    rec.start()
    got = rec.start_pyspy(os.getpid(), rate=10, attach_timeout_s=1.0, unavailable="{problem}; sampler only")
    assert got is not None and got.startswith(problem)
    assert wait_until(lambda: rec.sampler is not None and rec.sampler.stats.samples >= 3, timeout=10)
    summary = rec.close("complete")
    assert said == [f"{got}; sampler only"]
    assert summary is not None and summary.status == "complete" and summary.sampler.samples >= 3
    assert integrity_ok(out)
    _text, js = _reported(out, capsys)
    assert f"{got}: no stall estimate or loader attribution from py-spy's stacks" in " ".join(js["notes"])
