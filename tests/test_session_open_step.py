"""Session.open_step/add_wait/add_samples/close_step: steps a framework's loop drives, on an injected clock."""

from __future__ import annotations

import time
from itertools import pairwise
from pathlib import Path

import pytest

from profiler import Session
from profiler.core.store import load_run


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_driven_steps_tile_time_and_carry_their_wait_samples_and_phases(tmp_path: Path) -> None:
    clock = Clock()
    with Session(tmp_path, sources=[], clock=clock, device="cpu") as s:
        for i in range(3):
            s.open_step()  # the loop asks for a batch: the previous step ends here
            clock.t += 0.010  # two micro-batches fetched, 4 ms and 6 ms
            s.add_wait(0.004)
            s.add_wait(0.006)
            s.add_samples(8)
            s.add_samples(8 if i != 1 else None)  # step 1 took a batch whose size cannot be told
            with s.phase("compute"):
                clock.t += 0.020
            clock.t += 0.001
        s.close_step()  # the epoch ended
        s.add_wait(1.0)  # outside a step: ignored
    steps = load_run(tmp_path).steps
    assert [st.step for st in steps] == [0, 1, 2]
    assert [st.t_end - st.t_start for st in steps] == pytest.approx([0.031] * 3)
    assert all(a.t_end == pytest.approx(b.t_start) for a, b in pairwise(steps))
    assert [st.data_wait_s for st in steps] == pytest.approx([0.010] * 3)
    assert [st.samples for st in steps] == [16, None, 16]
    phases = load_run(tmp_path).phases
    assert [(p.step, p.name) for p in phases] == [(0, "compute"), (1, "compute"), (2, "compute")]


def test_open_step_needs_a_started_session(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="started session"):
        Session(tmp_path, sources=[]).open_step()


def test_open_step_stops_on_a_dead_store_when_asked_to_raise(tmp_path: Path) -> None:
    """``store_errors="raise"``: a driven loop stops at the next step once the store stopped writing, as wrap() does."""
    import shutil

    from profiler.core.store import StoreWriteError

    out = tmp_path / "run"
    with pytest.raises(StoreWriteError, match="stopped at step"), Session(out, sources=[], store_errors="raise") as s:
        s.open_step()
        shutil.rmtree(out)
        rec = s.recording
        for _ in range(10_000):  # the writer notices at its next flush (0.5 s)
            s.open_step()
            if rec.failure is not None:
                s.open_step()  # the step after the failure is seen: raises
            time.sleep(0.001)
