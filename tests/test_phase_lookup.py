"""``Session.phase(name)`` on the hot path (issue #65 item 6): a loop writes ``with s.phase("compute"):`` every
step, so finding a known phase must cost the training thread no Python frame (it took two, each a few us on a
step whose caches the model's compute has emptied: docs/benchmarks.md, the fast loop)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

from profiler import Session
from profiler.core.store import load_run


def test_a_known_phase_is_found_with_no_python_call(tmp_path: Path) -> None:
    calls: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            calls.append(frame.f_code.co_name)

    with Session(tmp_path, sample_hz=10, device="cpu", sources=[]) as s:
        first = s.phase("compute")  # made on first use
        found = []
        sys.setprofile(profile)
        try:
            for _ in range(1000):
                found.append(s.phase("compute"))
        finally:
            sys.setprofile(None)
        assert calls == [], calls[:5]
        assert all(p is first for p in found)
        for _ in s.wrap([[1, 2]] * 5):
            with s.phase("compute"), s.phase("forward"):
                pass
    names = [p.name for p in load_run(tmp_path).phases]
    assert names == ["compute", "compute/forward"] * 5


def test_a_phase_before_the_start_is_not_kept_and_counts_outside_any_step(tmp_path: Path) -> None:
    s = Session(tmp_path, sample_hz=10, device="cpu", sources=[])
    early = s.phase("compute")
    assert s.phase("compute") is not early  # not kept: nothing to charge it to yet
    with early:
        pass
    with s:
        kept = s.phase("compute")
        assert s.phase("compute") is kept
        for _ in s.wrap([[1]] * 3):
            with kept:
                pass
    assert s._st.unattributed == 1  # the count behind the "ran outside any step" warning
    assert len(load_run(tmp_path).phases) == 3
