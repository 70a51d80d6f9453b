"""``Session(log_to=...)``: the run's points logged while it records, off the training thread, read back with the
tracker's own reader; and trackers that fail or block, which cost the training nothing.

Truth: the loader sleeps ``WAIT_S`` in each ``next()``; the run figures logged at the close are the means over the
measured steps, which on a CPU are the Summary's own (the same rows, the same sums).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import Truth, sleep_loader, stallscope, wait_until

from profiler import Session
from profiler.trackers.analysis import Point

WAIT_S, STEPS, WARMUP, BATCH = 0.004, 60, 2, 4


def loop(s: Session, truth: Truth, steps: int = STEPS) -> list[float]:
    """The training loop; each step's wall time as the loop itself sees it."""
    took = []
    t = time.perf_counter()
    for _ in s.wrap(sleep_loader(steps + WARMUP, WAIT_S, BATCH, truth)):
        with s.phase("compute"):
            time.sleep(0.002)
        now = time.perf_counter()
        took.append(now - t)
        t = now
    return took


def run_until(s: Session, truth: Truth, done: Callable[[], bool], deadline_s: float = 30.0) -> int:
    """The loop for STEPS steps and on, looking every ten steps, until ``done()`` or ``deadline_s``: a live
    tracker's points come from the store's commits (every 0.5 s) or the sampler process's feed, so a short run on a
    quiet host can end before the first (a 0.4 s run did), and a slow start beside busy processes later still. The
    run is made long enough; the check is never weakened. Returns the steps run, warm-up included."""
    ran, deadline = 0, time.monotonic() + deadline_s
    for _ in s.wrap(sleep_loader(100_000, WAIT_S, BATCH, truth)):
        with s.phase("compute"):
            time.sleep(0.002)
        ran += 1
        looks = ran >= WARMUP + STEPS and ran % 10 == 0
        if looks and (done() or time.monotonic() > deadline):
            break
    return ran


def _points(tb: Path, tag: str) -> list[Any]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # the sampler process makes the directory with its first point: a loaded CI's look came before it, and
    # tensorboard's reader raised NotFoundError where it means "no point yet"
    if not tb.is_dir():
        return []
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    return list(acc.Scalars(tag)) if tag in acc.Tags()["scalars"] else []


def test_tensorboard_live_from_the_sampler_process(tmp_path: Path) -> None:
    """Points every 0.2 s while the loop runs, from the sampler process. The loop runs its 60 steps and then on
    until the first point has been written, so a sampler process slow to start beside busy processes (a fresh-clone
    CI: its first point came only at the close of a 0.4 s run) makes the run longer, never the check weaker; a
    logger that writes nothing while the run goes on fails at the deadline."""
    truth, tb = Truth(), tmp_path / "tb"
    with Session(
        tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, log_to=f"tensorboard:{tb}", log_every_s=0.2
    ) as s:
        ran = run_until(s, truth, lambda: bool(_points(tb, "stall/data_wait_ms")))
    summary = s.summary()
    assert summary is not None and summary.steps == ran - WARMUP
    waits = _points(tb, "stall/data_wait_ms")
    # a point written while the loop ran: the close's covers the last step (ran - 1), still running at the look
    assert [e for e in waits if e.step < ran - 1], f"no point while the run went on ({ran} steps)"
    assert len(waits) >= 2 and waits[-1].step == ran - 1  # and the last at the close
    assert all(e.value >= WAIT_S * 1e3 * 0.999 for e in waits)  # each point's mean holds the injected sleep
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    run = {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"] if tag.startswith("stall/run/")}
    assert run["stall/run/steps"] == ran - WARMUP
    assert run["stall/run/data_wait_ms"] == pytest.approx(summary.breakdown_ms_per_step.data_wait, rel=1e-5)
    assert run["stall/run/step_ms"] == pytest.approx(summary.step_time_ms.mean, rel=1e-5)
    tput = summary.throughput_samples_per_s
    assert run["stall/run/throughput_samples_per_s"] == pytest.approx(tput, rel=1e-5)


class Sleeper:
    """A tracker stand-in that blocks 5 s in every call."""

    name = "sleeper"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def log(self, points: Sequence[Point]) -> None:
        self.calls.append("log")
        time.sleep(5)

    def log_summary(self, figures: object, step: int) -> None:
        self.calls.append("summary")
        time.sleep(5)

    def log_text(self, name: str, text: str) -> None:
        time.sleep(5)

    def log_artifact(self, path: Path) -> None:
        time.sleep(5)

    def close(self) -> None:
        time.sleep(5)


class Raiser(Sleeper):
    name = "raiser"

    def log(self, points: Sequence[Point]) -> None:
        self.calls.append("log")
        raise RuntimeError("the tracker's server said no")

    def log_summary(self, figures: object, step: int) -> None:
        raise RuntimeError("the tracker's server said no")

    def close(self) -> None:
        pass


def test_a_tracker_that_blocks_holds_up_no_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Points every 0.1 s to a tracker that takes 5 s a call: no step of the loop waits for it, and the close
    waits for it at most ``close_wait_s`` (5 s) and says so."""
    truth, sleeper = Truth(), Sleeper()
    with Session(tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, log_to=[sleeper], log_every_s=0.1) as s:
        took = loop(s, truth)
        t_close = time.perf_counter()
    closed_s = time.perf_counter() - t_close
    assert sleeper.calls[:1] == ["log"]  # it was called (and blocked) while the loop ran
    # a step that waited for one call would take 5 s; the loop's slowest step is the loader's sleep and the host
    assert max(took) < 1.0, max(took)
    assert closed_s < 5.0 + 3.0
    summary = s.summary()
    assert summary is not None and summary.steps == STEPS and summary.status == "complete"
    said = [r.getMessage() for r in caplog.records if "tracker sleeper" in r.getMessage()]
    assert len(said) == 1 and "still writing" in said[0]


def test_a_tracker_that_raises_is_one_warning_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    truth, raiser = Truth(), Raiser()
    caplog.set_level(logging.WARNING, "stallscope")
    with Session(tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, log_to=[raiser], log_every_s=0.1) as s:
        ran = run_until(s, truth, lambda: len(raiser.calls) >= 2)
        during = len(raiser.calls)
    summary = s.summary()
    assert summary is not None and summary.steps == ran - WARMUP and summary.status == "complete"
    assert during >= 2, (during, ran)  # while the run went on, it was called again after its first error
    said = [r.getMessage() for r in caplog.records if "tracker raiser" in r.getMessage()]
    assert said == [
        "stallscope: tracker raiser: writing failed: RuntimeError: the tracker's server said no; the run goes on "
        "without it"
    ]


def test_an_unwritable_log_dir_is_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    caplog.set_level(logging.WARNING, "stallscope")
    target = f"tensorboard:{blocked / 'tb'}"
    with Session(
        tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, sampling="thread", log_to=target, log_every_s=0.1
    ) as s:
        loop(s, Truth(), steps=10)
    summary = s.summary()
    assert summary is not None and summary.steps == 10 and summary.status == "complete"
    said = [r.getMessage() for r in caplog.records if f"tracker {target}" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"stallscope: tracker {target}: opening it failed: ")


def test_an_unreachable_mlflow_server_is_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing listens on the discard port: the client's first request fails (no retry, as configured here)."""
    import mlflow.tracking  # noqa: F401  # imported before: its import (seconds on a busy host) is not the point here

    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    caplog.set_level(logging.WARNING, "stallscope")
    target = "mlflow:http://127.0.0.1:9"
    took: list[float] = []
    with Session(
        tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, sampling="thread", log_to=target, log_every_s=0.1
    ) as s:
        took = loop(s, Truth(), steps=10)
    assert max(took) < 1.0
    summary = s.summary()
    assert summary is not None and summary.steps == 10 and summary.status == "complete"
    said = [r.getMessage() for r in caplog.records if f"tracker {target}" in r.getMessage()]
    assert len(said) == 1 and "failed" in said[0] and ("Connection" in said[0] or "refused" in said[0]), said


def test_a_bad_target_fails_where_the_session_is_made(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'neptune': not a tracker: allowed tensorboard:DIR"):
        Session(tmp_path / "run", log_to="neptune")
    assert not (tmp_path / "run").exists()


def test_run_log_to_tensorboard(tiny_scenario: Callable[..., Path], tmp_path: Path) -> None:
    """``run --log-to``: the CLI's run logs the same names; its run figures are its summary.json's."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb, out = tmp_path / "tb", tmp_path / "run"
    proc = stallscope(
        "run", str(tiny_scenario(item_sleep=0.001, steps=20)), "--out", str(out), "--no-live", "--json",
        "--log-to", f"tensorboard:{tb}", "--log-every", "0.2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0})
    acc.Reload()
    assert acc.Scalars("stall/run/steps")[-1].value == summary["steps"] == 20
    got = acc.Scalars("stall/run/data_wait_ms")[-1].value
    assert got == pytest.approx(summary["breakdown_ms_per_step"]["data_wait"], rel=1e-5)
    assert acc.Scalars("stall/data_wait_ms")[-1].step == summary["warmup_steps"] + 20 - 1


def test_run_log_to_a_bad_target_is_one_line_exit_2(tiny_scenario: Callable[..., Path], tmp_path: Path) -> None:
    proc = stallscope("run", str(tiny_scenario()), "--out", str(tmp_path / "run"), "--log-to", "neptune")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == (
        "stallscope: error: --log-to 'neptune': not a tracker: allowed tensorboard:DIR, mlflow, mlflow:TRACKING_URI "
        "or wandb"
    )
    assert not (tmp_path / "run").exists()


def test_wandb_live_attaches_to_the_users_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user's ``wandb.run`` (offline) gets the points while the run records; stallscope neither makes nor
    finishes a run of its own (read back from the run file: tests/wandb_file.py says why not wandb-summary.json)."""
    import wandb
    import wandb_file

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    wandb.teardown()  # a wandb set up by an earlier test in this process keeps that test's WANDB_DIR
    run = wandb.init(project="mine", dir=str(tmp_path))
    try:
        run.log({"loss": 1.0})  # the user's own step 0: stallscope's points follow it, never before it
        with Session(tmp_path / "run", warmup=WARMUP, meta={"batch_size": BATCH}, log_to="wandb", log_every_s=0.2) as s:
            loop(s, Truth())
        assert wandb.run is run  # still the user's, still running
        summary = s.summary()
        assert summary is not None
    finally:
        run.finish()
        wandb.teardown()
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    # wandb's core process may still be writing the file when finish() returns (seen here: 7 bytes, its header)
    assert wait_until(lambda: bool(wandb_file.summary(run_file).get("stall/run/steps")), timeout=30)
    rows = wandb_file.history(run_file)
    points = [r for r in rows if "stall/data_wait_ms" in r]
    assert points and all(r["stall/data_wait_ms"] >= WAIT_S * 1e3 * 0.999 for r in points)
    assert points[-1]["stall/step"] == WARMUP + STEPS - 1
    got = wandb_file.summary(run_file)
    assert got["stall/run/steps"] == STEPS
    assert got["stall/run/data_wait_ms"] == pytest.approx(summary.breakdown_ms_per_step.data_wait, rel=1e-9)
    assert len(list(tmp_path.glob("wandb/offline-run-*"))) == 1
