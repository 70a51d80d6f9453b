"""The recording lifecycle: one Summary built at close from one read of the committed rows, equal to what `report`
reads back from the store; py-spy stopped before the summary is built."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import sleep_loader

from profiler import Session
from profiler.analysis import summarize
from profiler.core.recorders.in_thread import ThreadRecorder
from profiler.core.sampler_process.client import ProcessRecorder
from profiler.core.store import DB_NAME, load_run
from profiler.core.store import reader as store_reader
from profiler.core.store import writer as store_writer
from profiler.runs import cache as report_cache
from profiler.runs.summarize import summarize_run
from profiler.zerocode.profile import profile_external


def _loop(out: Path, steps: int = 12, sampling: str = "process") -> Session:
    with Session(out, warmup=2, sample_hz=50, sampling=sampling) as s:
        for _ in s.wrap(sleep_loader(steps, 0.004)):
            with s.phase("h2d"):
                time.sleep(0.001)
            with s.phase("compute"):
                time.sleep(0.006)
    return s


def test_close_summary_equals_the_report_read_back_from_the_store(tmp_path: Path) -> None:
    s = _loop(tmp_path)
    summary = s.summary()
    assert summary is not None and summary.steps == 10 and summary.sampler.samples > 3
    from_disk = summarize(load_run(tmp_path)).to_dict()
    assert summary.to_dict() == from_disk
    assert json.loads((tmp_path / "summary.json").read_text()) == from_disk


@pytest.mark.parametrize("sampling", ["process", "thread"])
def test_close_reads_the_committed_rows_back_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sampling: str
) -> None:
    """The store keeps no row per step in memory (memory stays flat however long the run: tests/test_scale.py), so
    the close summary comes from one read of the committed file and from no other read of the store: with threads
    in the training process, through the writer's own read connection; with the sampler process (which wrote the
    store and has ended), through the reader."""
    opened: dict[str, list[Path]] = {"writer": [], "reader": []}
    for where, module in (("writer", store_writer), ("reader", store_reader)):
        real = module.open_read

        def counting(db: Path, where: str = where, real: Callable[[Path], object] = real) -> object:
            opened[where].append(Path(db))
            return real(db)

        monkeypatch.setattr(module, "open_read", counting)
    # the report cache's key is the store as it is when the cache is written: its meta and step count, read apart
    # (no row) and counted apart
    heads: list[Path] = []
    real_head = report_cache.read_head

    def head(run: Path) -> tuple[dict[str, object], int]:
        before = {k: list(v) for k, v in opened.items()}
        got = real_head(run)
        heads.extend(p for k, v in opened.items() for p in v[len(before[k]) :])
        opened.update(before)
        return got

    monkeypatch.setattr(report_cache, "read_head", head)
    s = _loop(tmp_path, steps=6, sampling=sampling)
    summary = s.summary()
    assert summary is not None and summary.steps == 4 and summary.status == "complete"
    once = [tmp_path / DB_NAME]
    assert opened == ({"writer": once, "reader": []} if sampling == "thread" else {"writer": [], "reader": once})
    assert heads in ([], once)  # at most one head read, for the cache's key


def test_close_is_idempotent_and_returns_the_same_summary(tmp_path: Path) -> None:
    rec = ThreadRecorder(tmp_path, meta={"scenario": "x"}, sample_hz=20, sources=[], summarize=summarize_run)
    rec.start()
    rec.annotate(batch_size=4)
    first = rec.close("complete")
    assert first is not None and first.status == "complete" and first.batch_size == 4
    assert rec.close("failed", "late") is first
    assert load_run(tmp_path).meta["status"] == "complete"


def test_a_failed_run_keeps_its_status_and_error_in_the_close_summary(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError), Session(tmp_path) as s:
        for i, _ in enumerate(s.wrap(sleep_loader(5, 0.001))):
            with s.phase("compute"):
                if i == 3:
                    _ = 1 / 0
    summary = s.summary()
    assert summary is not None and summary.status == "failed"
    assert summary.error is not None and "ZeroDivisionError" in summary.error
    assert summary.to_dict() == summarize(load_run(tmp_path)).to_dict()


def test_a_warning_goes_through_the_injected_warn_and_into_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    said: list[str] = []
    rec = ThreadRecorder(tmp_path, meta={}, sample_hz=20, sources=[], warn=said.append, summarize=summarize_run)
    rec.start()
    monkeypatch.setenv("STALLSCOPE_PYSPY", str(tmp_path / "no-such-py-spy"))
    problem = rec.start_pyspy(os.getpid(), rate=10, attach_timeout_s=0.1, unavailable="no attribution: {problem}")
    assert problem is not None and "not installed" in problem
    assert said == [f"no attribution: {problem}"]
    summary = rec.close("complete")
    assert summary is not None
    meta = load_run(tmp_path).meta
    assert meta["pyspy_problem"] == problem and rec.pyspy_problem == problem


def test_zero_code_returns_the_summary_it_wrote(tmp_path: Path) -> None:
    script = tmp_path / "tiny.py"
    script.write_text("import time\nfor _ in range(3):\n    time.sleep(0.1)\n")
    result = profile_external(
        tmp_path / "run", command=[sys.executable, str(script)], sample_hz=20, pyspy_rate=50, warn=lambda _m: None
    )
    assert result.exit_code == 0 and result.summary is not None
    assert result.summary.mode == "zero-code"
    assert result.summary.to_dict() == summarize(load_run(tmp_path / "run")).to_dict()


def test_a_signal_while_the_session_starts_still_closes_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ctrl-C can land between the store's creation and the end of Session.start(), before `with session:`
    # is entered: the run must still be closed, reported and summarised as interrupted
    import scenarios
    from profiler.core.session import Interrupted
    from profiler.core.steps.device_timers import resolve_device
    from profiler.drivers.runner import RunConfig, RunStopped, run_scenario

    started = ProcessRecorder.start

    def start_then_signal(self: ProcessRecorder, t0: float) -> None:
        started(self, t0)
        raise Interrupted("SIGINT")

    monkeypatch.setattr(ProcessRecorder, "start", start_then_signal)
    cfg = RunConfig(out=tmp_path / "run", device=resolve_device("cpu"), steps=2, warmup=0)
    with pytest.raises(RunStopped) as info:
        run_scenario(scenarios.get("mlp-mnist"), cfg)
    summary = info.value.session.summary()
    assert summary is not None and summary.status == "interrupted" and summary.error == "stopped by SIGINT"
    assert load_run(tmp_path / "run").meta["status"] == "interrupted"


def test_both_recorders_keep_one_contract_for_views_and_pyspy(tmp_path: Path) -> None:
    """The runner and the sinks ask any recorder (profiler.core.hooks.Recorder), never which kind it is: a
    ThreadRecorder has no other process to serve views (False: the caller shows them), a ProcessRecorder's sampler
    process serves them (True: the fallback waits for its loss)."""
    from profiler.core.hooks import Recorder
    from profiler.core.sampler_process.client import ProcessRecorder

    called: list[str] = []
    here = ThreadRecorder(tmp_path / "t", meta={}, sample_hz=5, sources=[], summarize=summarize_run)
    there = ProcessRecorder(tmp_path / "p", meta={}, sample_hz=5, sources=[])
    recorders: list[Recorder] = [here, there]
    got = [r.add_views([], lambda: called.append("fallback")) for r in recorders]
    assert got == [False, True] and called == []
    assert all(callable(getattr(r, "start_pyspy", None)) for r in recorders)
