"""A sweep or tune stopped by SIGTERM / SIGINT part-way keeps what finished: exit 143 / 130, the finished rows in
``sweep.json`` / ``tune.json`` and their run stores intact, the configuration the signal stopped as a row
"interrupted", and ``stallscope report DIR`` prints the table again from the directory.

tests/data/scenarios/stop_mid_sweep.py settles only in its default configuration (batch 4, no workers), so the
second configuration is still running when the signal is sent, right after the first row reached the disk."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
import warm

from profiler.cli import main
from profiler.sweep.analysis import SweepRow, row_from_dict
from tests.conftest import ROOT, wait_until

SCENARIO = str(ROOT / "tests/data/scenarios/stop_mid_sweep.py")


def _stop_after_first_row(args: list[str], table: Path, sig: int) -> tuple[int, str]:
    """Run ``stallscope ARGS``, send ``sig`` once ``table`` holds a finished row; (exit code, stderr)."""
    proc = subprocess.Popen(
        [*warm.argv(), *args, "--no-live"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )

    def first_row() -> bool:
        try:
            doc = json.loads(table.read_text())
        except (OSError, ValueError):
            return False
        return any(r["status"] == "complete" for r in doc.get("rows", doc.get("runs", [])))

    try:
        assert wait_until(first_row, timeout=120)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, stderr


def _intact(run_dir: Path) -> int:
    """The run store passes PRAGMA integrity_check; its step count."""
    with sqlite3.connect(run_dir / "run.sqlite") as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return int(con.execute("SELECT count(*) FROM steps").fetchone()[0])


def _report(path: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    assert main(["report", str(path), *flags]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_sigterm_mid_sweep_keeps_the_finished_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    args = ["sweep", SCENARIO, "--batch-sizes", "4,8", "--workers", "0", "--steps", "100000", "--out", str(out)]
    code, stderr = _stop_after_first_row(args, out / "sweep.json", signal.SIGTERM)
    assert code == 143, stderr
    assert "Traceback" not in stderr and "stopped by SIGTERM" in stderr
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["status"] == "interrupted" and doc["planned"] == 2
    assert [(r["config"], r["status"]) for r in doc["rows"]] == [
        ("naive-b4-w0", "complete"),
        ("naive-b8-w0", "interrupted"),
    ]
    assert doc["rows"][1]["error"] == "stopped by SIGTERM"
    assert _intact(out / "naive-b4-w0") == doc["rows"][0]["steps"] + doc["rows"][0]["warmup_steps"]
    _intact(out / "naive-b8-w0")  # what the stopped configuration measured is kept too
    text = _report(out, capsys)
    assert "Sweep of stop-mid-sweep" in text and "naive-b8-w0 interrupted: stopped by SIGTERM" in text
    assert f"{doc['rows'][0]['throughput_samples_per_s']:.1f}" in text
    assert json.loads(_report(out, capsys, "--json")) == doc


@pytest.mark.slow
def test_sigint_mid_tune_keeps_the_finished_trials(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tune"
    args = ["tune", SCENARIO, "--pipelines", "naive", "--steps", "100000", "--budget-s", "600", "--out", str(out)]
    code, stderr = _stop_after_first_row(args, out / "tune.json", signal.SIGINT)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    doc = json.loads((out / "tune.json").read_text())
    assert doc["status"] == "interrupted"
    trials = doc["trials"]
    assert [r["status"] for r in trials] == ["complete", "interrupted"] and trials[0]["config"] == "naive-b4-w0"
    assert doc["recommended"] == {"pipeline": "naive", "batch_size": 4, "workers": 0}  # the best before the stop
    for r in trials:
        _intact(Path(r["run_dir"]))
    text = _report(out, capsys)
    assert "Tune: 2 trials" in text and "interrupted" in text and "stopped by SIGINT after 2 trials" in text


def test_report_reads_a_tune_killed_mid_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGKILL leaves tune.json as the running tune last wrote it: the trials so far, which report shows."""
    done = SweepRow("naive", 4, 0, "complete", str(tmp_path / "t01"), throughput_samples_per_s=123.4, steps=9)
    doc = {"status": "running", "scenario": "s", "device": "cpu", "runs": [done.to_dict()]}
    (tmp_path / "tune.json").write_text(json.dumps(doc))
    text = _report(tmp_path, capsys)
    assert "s (tune, unfinished)" in text and "123.4" in text


def test_a_corrupt_table_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "sweep.json").write_text('{"rows": [')
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "sweep.json" in err and "not a readable sweep table" in err


def test_rows_round_trip_through_their_json() -> None:
    row = SweepRow("prefetch", 16, 2, "interrupted", "/x", "stopped by SIGINT", steps=3, step_time_ms={"mean": 1.5})
    again = row_from_dict(json.loads(json.dumps({**row.to_dict(), "added_by_a_newer_version": 1})))
    assert again.to_dict() == row.to_dict()


@pytest.mark.parametrize("command", ["sweep", "tune"])
def test_an_unwritable_run_store_stops_the_whole_sweep_or_tune(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configuration whose run store cannot be written (the disk full, say) ends the sweep or tune at once:
    exit 1, one line naming what could not be written, no next configuration (it would fail alike)."""
    import profiler.sweep.run
    from profiler.core.store import StoreWriteError
    from profiler.drivers.runner import TrainingError

    calls: list[Path] = []

    def full_disk(_scenario: object, cfg: Any, _monitor: object = None) -> None:
        calls.append(cfg.out)
        db = cfg.out / "run.sqlite"
        failure = StoreWriteError(f"could not write the run store {db}: database or disk is full", db, 3)
        raise TrainingError("the run store stopped writing", cfg.out) from failure

    monkeypatch.setattr(profiler.sweep.run, "run_scenario", full_disk)
    out = tmp_path / command
    extra = (
        ["--batch-sizes", "4,8", "--workers", "0"] if command == "sweep" else ["--pipelines", "naive", "--steps", "5"]
    )
    code = main([command, SCENARIO, *extra, "--out", str(out), "--no-live", "--device", "cpu"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "could not write" in line]
    assert code == 1, err
    assert len(calls) == 1  # the next configuration was never started
    assert len(lines) == 1 and str(calls[0] / "run.sqlite") in lines[0] and "database or disk is full" in lines[0]
    assert "Traceback" not in err
