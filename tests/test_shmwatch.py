"""The shared-memory watch (profiler/drivers/shmwatch.py): a wait with the segment full ends the run naming shared
memory, where torch's DataLoader would wait forever for a batch its worker's queue dropped.

Its rule is checked through fakes of the clock, the wait and the segment; the runner's use of it on a real
DataLoader whose batches stop coming (tests/data/scenarios/stuck_loader.py), with the segment reading full: the
run fails within the watch's time, the workers are gone, and the steps before the wait are kept."""

from __future__ import annotations

import multiprocessing
import time
from functools import partial
from pathlib import Path

import pytest

import scenarios
from profiler.core.steps.device_timers import resolve_device
from profiler.core.store import load_run
from profiler.drivers import runner
from profiler.drivers.runner import LoaderFailure, RunConfig, TrainingError, run_scenario
from profiler.drivers.shmwatch import ShmWatch
from tests.conftest import ROOT, wait_until


class Fake:
    """The watch's inputs as a test sets them: the clock, the wait's start, the segment, a batch's MiB."""

    def __init__(self) -> None:
        self.now = 0.0
        self.wait: float | None = 0.0
        self.free, self.size = 4.0, 12.0
        self.batch: float | None = 8.0
        self.stops = 0

    def watch(self) -> ShmWatch:
        def stop() -> None:
            self.stops += 1

        return ShmWatch(
            lambda: self.wait,
            lambda: self.now,
            lambda: self.batch,
            segment=lambda: (self.free, self.size),
            stop=stop,
            stuck_s=15.0,
        )

    def tick(self, w: ShmWatch, seconds: float) -> bool:
        self.now += seconds
        return w.check()


def test_a_wait_with_the_segment_full_for_the_watch_time_stops_the_workers_once() -> None:
    f = Fake()
    w = f.watch()
    assert not f.tick(w, 1.0)  # full from here (t = 1)
    assert not f.tick(w, 14.9)  # 14.9 s full
    assert f.tick(w, 0.1) and f.stops == 1  # 15 s full
    assert w.finding is not None and w.finding.startswith("no batch came for 16 s while shared memory was full")
    assert "(4.0 MiB free of 12, a batch needs 8.0)" in w.finding
    assert f.tick(w, 1.0) and f.stops == 1  # said and done once


@pytest.mark.parametrize(
    "change",
    [
        "room",  # one check with room for a batch: the count starts again
        "new wait",  # the wait ended and another began: a new count
        "no wait",  # the training is not in next() (a long compute step with the slots full is no stall)
        "batch unknown",  # nothing to judge the segment against
    ],
)
def test_room_for_a_batch_a_new_wait_or_no_wait_restart_the_count(change: str) -> None:
    f = Fake()
    w = f.watch()
    assert not f.tick(w, 10.0)
    if change == "room":
        f.free = 8.0
    elif change == "new wait":
        f.wait = 10.0
    elif change == "no wait":
        f.wait = None
    else:
        f.batch = None
    assert not f.tick(w, 1.0)  # t = 11: the change
    f.free, f.batch = 4.0, 8.0
    f.wait = f.wait if change != "no wait" else 11.5
    # a new wait is judged from the check that saw it (t = 11, the segment full there); the others from the next
    # full check (t = 12): 15 s later, and not at the 10 s already counted before the change
    since = 11.0 if change == "new wait" else 12.0
    assert not f.tick(w, 1.0)
    assert not f.tick(w, since + 14.9 - f.now), "the count restarted at the change"
    assert f.tick(w, 0.2) and f.stops == 1


def test_a_run_whose_batches_stop_coming_with_the_segment_full_fails_naming_shared_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the segment reads full (1 MiB free of 12) and a batch needs 2 MiB once four steps are done (before, the
    # batch is unknown to the watch, whatever the workers' start-up takes); the watch judges after 2 s, not 15
    monkeypatch.setattr(runner, "ShmWatch", partial(ShmWatch, segment=lambda: (1.0, 12.0), stuck_s=2.0, every_s=0.2))
    monkeypatch.setattr(runner._Loop, "_watched_batch_mb", lambda loop: 2.0 if loop.done >= 4 else None)
    scenario = scenarios.get(str(ROOT / "tests" / "data" / "scenarios" / "stuck_loader.py"))
    out = tmp_path / "run"
    cfg = RunConfig(out=out, device=resolve_device("cpu"), workers=2, attribution=False)
    before = {child.pid for child in multiprocessing.active_children()}  # an earlier test's, not this run's
    t0 = time.monotonic()
    with pytest.raises(TrainingError) as info:
        run_scenario(scenario, cfg)
    elapsed = time.monotonic() - t0
    err = info.value
    assert isinstance(err.__cause__, LoaderFailure)
    assert err.where.startswith("the loader failed at step 4 of 21 (steps 0-3 are kept): no batch came for "), err.where
    assert "while shared memory was full (1.0 MiB free of 12, a batch needs 2.0)" in err.where
    assert "stallscope stopped the workers; shared memory (/dev/shm) ran out: the loader needs about" in err.where
    assert "--shm-size" in err.where and "\n" not in err.where
    # stopped 2 s into the wait (and at most a check and torch's 5 s poll later), not after the item's hour
    assert elapsed < 60, elapsed

    # the workers are gone: killed, each ends once the kernel gets to it (beside busy processes, not at once: a CI
    # run found one still alive at the first look)
    def ours() -> list[int | None]:
        return [c.pid for c in multiprocessing.active_children() if c.pid not in before]

    assert wait_until(lambda: ours() == [], timeout=10), ours()
    assert [s.step for s in load_run(out).steps][:4] == [0, 1, 2, 3]
    assert err.session is not None and err.session.status == "failed"
