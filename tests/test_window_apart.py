"""Kernel windows never land in the run's figures (issue #55): a recorder that costs what CUPTI cost on an H200
(tests/cupti_like.py: 600 ms to stop, steps 20% slower inside) leaves every reported figure within 1% of the
loop's own timing of the steps outside the windows, in the same run on the same clock: stopped on the training
thread, or (CUDA's path, ``off=1``) on the windows' own thread while the loop goes on, the GIL held 30 ms for the
hand-over."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import cupti_like
import pytest
from conftest import ROOT, stallscope

from profiler import Session
from profiler.analysis import summarize
from profiler.analysis.apart import spans
from profiler.analysis.summary import Summary
from profiler.core.rows import KernelWindow, RunRecord, StepRow, held_steps
from profiler.core.store import load_run

BATCH = 8
SCENARIO = ROOT / "tests" / "data" / "scenarios" / "window_cost.py"
SCRIPT = ROOT / "tests" / "data" / "window_train.py"
SCRIPT_WORK_S = 0.006  # each step's work (a sleep) in SCRIPT (WORK_S) and in SCENARIO (FORWARD_S)
# each phase 2 ms or more: the Session's own reads at a phase's edges (5-11 us beside two busy processes) stay
# under half of the 1% bound
H2D_S, COMPUTE_S = 0.002, 0.004  # and no other work of the loop's own


class Own:
    """The loop's own clock readings: each step's start (the loop asking for its batch) and its phases."""

    def __init__(self) -> None:
        self.ask: list[float] = []  # the loop asks for batch i (perf_counter), one more at the end
        self.phase: dict[str, list[float]] = {"h2d": [], "compute": []}
        self.slowed: list[bool] = []

    def batches(self, n: int) -> Iterator[object]:
        """n tiny batches; each ask read first thing in the generator's body (the batch is made before)."""
        import torch

        return self._asked(torch.zeros(BATCH, 2), n)

    def _asked(self, batch: object, n: int) -> Iterator[object]:
        for _ in range(n):
            self.ask.append(time.perf_counter())
            yield batch
        self.ask.append(time.perf_counter())

    def timed(self, name: str, seconds: float) -> None:
        t0 = time.perf_counter()
        cupti_like.work(seconds)
        self.phase[name].append(time.perf_counter() - t0)


def _loop(out: Path, n: int, *, steps: int | None) -> tuple[Summary, Own, Session]:
    own = Own()
    cupti_like.CALLS.clear()
    # one warm-up step: the first step carries the Session's own first-step set-up (0.1-0.5 ms here)
    with Session(out, kernel_recorder=cupti_like.CuptiLike(), steps=steps, sample_hz=5, warmup=1) as s:
        total = 1 + n + s.tail_steps
        for _ in s.wrap(own.batches(total)):
            own.slowed.append(cupti_like.ACTIVE[0])
            with s.phase("h2d"):
                own.timed("h2d", H2D_S)
            with s.phase("compute"):
                own.timed("compute", COMPUTE_S)
    summary = s.summary()
    assert summary is not None
    return summary, own, s


def _ms(runq_s: float | None) -> float:
    """A phase's run-queue wait in ms; 0 where the Session did not read it."""
    return runq_s * 1e3 if runq_s is not None and math.isfinite(runq_s) else 0.0


def _own_figures(own: Own, measured: list[int]) -> dict[str, float]:
    """The loop's own figures over the steps stallscope measured: step time from its own readings (from asking
    for a batch to asking for the next), its phases, and samples per second."""
    step = [own.ask[i + 1] - own.ask[i] for i in measured]
    return {
        "step_ms": sum(step) / len(step) * 1e3,
        "h2d_ms": sum(own.phase["h2d"][i] for i in measured) / len(measured) * 1e3,
        "compute_ms": sum(own.phase["compute"][i] for i in measured) / len(measured) * 1e3,
        "throughput": BATCH * len(step) / sum(step),
    }


OFF_THREAD = "off=1,hold=0.03"  # STALLSCOPE_FAKE_CUPTI: CUDA's path, the stop on the windows' own thread


def _check(summary: Summary, own: Own, rec: RunRecord, n: int, off_thread: bool = False) -> None:
    held = held_steps(spans(rec.windows), rec.steps, rec.meta.get("kernel_window_tail_from"))
    measured = [s.step for s in rec.steps if not s.warmup and s.step not in held]
    slowed = {i for i, on in enumerate(own.slowed) if on}
    if off_thread:  # held: the steps from the start's call to the stop's end (the loop went on meanwhile)
        (_, a, _), (_, _, b), _ = cupti_like.CALLS
        during = {i for i in range(len(own.ask) - 1) if own.ask[i] < b and own.ask[i + 1] > a}
        # and a step that began between the stop's end and the window thread's next clock reading
        assert slowed and slowed <= during <= held <= during | {max(during) + 1}, (sorted(held), sorted(during))
    else:  # every step the recorder slowed or paused is held; the held steps are those and no more
        starts = [t for what, t, _ in cupti_like.CALLS]
        paused = {i for i in range(len(own.ask) - 1) for t in starts if own.ask[i] <= t < own.ask[i + 1]}
        assert paused and slowed and held == paused | slowed, (sorted(held), sorted(paused), sorted(slowed))
    truth = _own_figures(own, measured)
    b = summary.breakdown_ms_per_step
    got = {
        "step_ms": summary.step_time_ms.mean,
        "h2d_ms": b.h2d,
        "compute_ms": b.compute,
        "throughput": summary.throughput_samples_per_s,
    }
    for key in ("step_ms", "throughput"):
        assert got[key] == pytest.approx(truth[key], rel=0.01), (key, got, truth)
    # a phase's span holds the loop's own reads inside it and the Session's few reads at its edges: never less,
    # and per step within 1% of the step but where the training thread was preempted between two reads
    # microseconds apart (beside busy processes: that time is the phase's to the Session and not to the loop; one
    # such step of 30 moved the mean 1.03% in a fresh-clone CI). The phase's own run-queue wait, where the Session
    # read it, is that preemption, so the excess is taken net of it; at most one step in ten past 1% besides
    # (a step whose run queue was not read, or a preemption between the loop's read and the phase's edge).
    for key, name in (("h2d_ms", "h2d"), ("compute_ms", "compute")):
        assert got[key] - truth[key] >= 0, (key, got, truth)
        mine = {ph.step: (ph.t_end - ph.t_start) * 1e3 for ph in rec.phases if ph.name == name}
        waited = {ph.step: _ms(ph.runq_s) for ph in rec.phases if ph.name == name}
        excess = {i: mine[i] - own.phase[name][i] * 1e3 for i in measured}
        over = [i for i in measured if excess[i] - waited[i] > 0.01 * truth["step_ms"]]
        assert len(over) <= len(measured) // 10, (key, [(i, excess[i], waited[i]) for i in over], got, truth)
    # the check can fail: the steps the recorder slowed (held, above) ran 20% slower by the loop's own clock, so
    # with them in the figures would carry the window. Medians: a preempted step beside busy processes moves a mean
    # (20 slowed steps in 200 add 2% to it, within the noise of a loaded host: red in a fresh-clone CI). The loop's
    # own work (its phases, 6 ms of sleep a step, 7.2 ms slowed) against every step not slowed, and the least each
    # took: a sleep's overshoot on a loaded host only adds (medians failed at load 15: a step's 6 ms of sleep took
    # 7.8 ms there, with 30 steps the stop holds all but four, and the slowed median was 7.4)
    step = [own.ask[i + 1] - own.ask[i] for i in range(len(own.ask) - 1)]
    work = [h + c for h, c in zip(own.phase["h2d"], own.phase["compute"], strict=True)]
    warm = {st.step for st in rec.steps if st.warmup}
    plain = [i for i in range(len(work)) if i not in slowed and i not in warm]
    assert min(work[i] for i in slowed) > 1.1 * min(work[i] for i in plain), (sorted(slowed), work)
    assert summary.steps == len(measured)
    # the loop's "other" (outside its phases) as its own clock saw it: any LOOP_OVERHEAD advice is the loop's own
    # (on a loaded host its preemptions land there), never the window's pause
    own_other = truth["step_ms"] - truth["h2d_ms"] - truth["compute_ms"] - b.data_wait  # the loader's next(): apart
    assert abs(b.other - own_other) <= 0.01 * truth["step_ms"], (b.other, own_other)
    if any(r.code == "LOOP_OVERHEAD" for r in summary.recommendations):
        assert own_other >= 1.0 and own_other >= 0.1 * truth["step_ms"], (own_other, summary.recommendations)
    assert summary.gpu is None  # the windows recorded no activity: no GPU finding
    assert "host-bound" not in summary.verdict
    apart = summary.kernel_windows
    assert apart is not None and apart.steps == len(held) and apart.windows == len(rec.windows) >= 1
    if off_thread:
        _paid_start_and_hold(cupti_like.CALLS, apart.cost_s)
        # what the windows added to the run, against the loop's own clock: its held steps less as many at its median
        # measured step, and the close, after the last step, waiting for a stop still running. Not a fixed bound:
        # beside the suite the held steps ran slower than the measured ones by the host's load (0.31 s added where
        # the recorder held the loop 83 ms, a fresh-clone CI), and that is what the run did
        mine = [step[i] for i in sorted(held - warm)]
        waited = max(0.0, rec.windows[-1].t_end - max(st.t_end for st in rec.steps))
        own_added = math.fsum(mine) + waited - len(mine) * statistics.median(step[i] for i in measured)
        assert apart.added_s == pytest.approx(own_added, abs=0.01 * apart.wall_s), (apart, own_added)
        # and the loop went on through the stop: none of its steps held as long as the stop's own sleep
        assert max(mine) < _stop_alone(cupti_like.CALLS), (max(mine), cupti_like.CALLS)
    else:
        assert apart.cost_s >= 0.6 * apart.windows  # the recorder's stop alone
        assert apart.added_s > 0.6 * apart.windows * 0.9


def _stop_alone(calls: list[tuple[str, float, float]]) -> float:
    """The recorder's stop without the GIL's hold that ends it (the stop's span holds the hold's)."""
    span = {what: t1 - t0 for what, t0, t1 in calls}
    return span["stop"] - span.get("hold", 0.0)


def _paid_start_and_hold(calls: list[tuple[str, float, float]], cost_s: float) -> None:
    """Off the thread, the training thread paid the window's start and the GIL's hold, as the recorder's own clock
    read them in the same run (the hold, a CPU-bound call, took 30 ms alone and several times that beside the
    suite), and never the stop's sleep (600 ms): at most the hand-overs besides (61 ms beside the suite)."""
    span = {what: t1 - t0 for what, t0, t1 in calls}
    paid = span["start"] + span["hold"]
    assert paid <= cost_s < paid + 0.5 and _stop_alone(calls) >= 0.6, (cost_s, calls)


PATHS = pytest.mark.parametrize("off_thread", [False, True], ids=["stopped-here", "off-thread"])


@PATHS
@pytest.mark.parametrize("n", [30, 200])
def test_a_window_in_the_middle_is_held_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, off_thread: bool
) -> None:
    """A Session of unknown length: auto opens a window 5 steps in (20 steps); its steps are held."""
    if off_thread:
        monkeypatch.setenv(cupti_like.ENV, OFF_THREAD)
    summary, own, s = _loop(tmp_path, n, steps=None)
    rec = load_run(tmp_path)
    assert len(rec.windows) == 1 and rec.meta.get("kernel_window_tail_from") is None
    _check(summary, own, rec, n, off_thread)
    if not off_thread:
        assert summary.steps == n - 21  # the opening step, 19 inside, the closing step
    # what a sweep's rows and the tuner read from the Session: the same measured steps
    held = held_steps(spans(rec.windows), rec.steps)
    assert s.step_times() == [st.t_end - st.t_start for st in rec.steps if not st.warmup and st.step not in held]


@PATHS
@pytest.mark.parametrize("n", [30, 200])
def test_a_run_of_known_length_records_its_window_after_the_measured_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n: int, off_thread: bool
) -> None:
    if off_thread:
        monkeypatch.setenv(cupti_like.ENV, OFF_THREAD)
    summary, own, s = _loop(tmp_path, n, steps=n)
    rec = load_run(tmp_path)
    assert s.tail_steps == min(20, max(5, -(-n // 3)))
    assert rec.meta["kernel_window_tail_from"] == n + 1
    _check(summary, own, rec, n, off_thread)
    assert summary.steps == n  # no measured step lost to the window
    assert summarize(rec).to_dict()["kernel_windows"]["steps"] == s.tail_steps


def test_held_steps_are_those_that_overlap_a_windows_span() -> None:
    steps = [StepRow(i, i * 1.0, i + 1.0, 0.0, 1, i < 1) for i in range(10)]
    w = KernelWindow(0, 3.5, 6.2, 0.4, [])
    assert held_steps(spans([w]), steps) == {3, 4, 5, 6}
    assert held_steps(spans([w]), steps, tail_from=8) == {3, 4, 5, 6, 8, 9}
    assert held_steps([], steps) == set()


RECORDER = {"STALLSCOPE_KERNEL_RECORDER": "tests.cupti_like:CuptiLike"}


def _off_thread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """CUDA's path for a subprocess's recorder, its calls written to the file returned."""
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv(cupti_like.ENV, OFF_THREAD)
    monkeypatch.setenv(cupti_like.CALLS_ENV, str(calls))
    return calls


def _within_1pct_of_own(out: Path, own_step_s: dict[int, float], summary: dict, calls: Path | None = None) -> None:  # type: ignore[type-arg]
    """The run's step time and throughput against the loop's own clock over the steps it measured."""
    rec = load_run(out)
    held = held_steps(spans(rec.windows), rec.steps, rec.meta.get("kernel_window_tail_from"))
    measured = [s.step for s in rec.steps if not s.warmup and s.step not in held]
    assert len(rec.windows) == 1 and held and measured and set(measured) <= set(own_step_s)
    own = [own_step_s[i] for i in measured]
    assert summary["steps"] == len(measured)
    assert summary["step_time_ms"]["mean"] == pytest.approx(sum(own) / len(own) * 1e3, rel=0.01)
    assert summary["throughput_samples_per_s"] == pytest.approx(8 * len(own) / sum(own), rel=0.01)
    # the check can fail: the steps the window recorded ran slower by the loop's own clock (its work 20% longer), so
    # with them in the figures would carry the window. Off the thread the loop goes on through the stop, and the
    # held steps' mean was once under the measured ones' (7.79 against 7.85 ms: 19 slowed of 114 held, beside the
    # suite); their medians, apart, differ by the injected 1.2 ms (1.09 there), and at load 15 by 0.52 ms (a 6 ms
    # step took 7.8-13 ms there). The least step of each: a loaded host's preemptions and sleep overshoot only add.
    # Checked against half of the injected difference
    win = rec.windows[0]
    inside = [s.step for s in rec.steps if s.t_start >= win.t_start and s.t_end <= win.t_recorded]
    slowed = [i for i in inside if i in own_step_s]  # a run's last step has no own reading after it
    extra = cupti_like.settings()["slow"] * SCRIPT_WORK_S
    assert set(slowed) <= held and len(slowed) >= 5, (slowed, sorted(held))
    gap = min(own_step_s[i] for i in slowed) - min(own)
    assert gap > 0.5 * extra, (gap, [own_step_s[i] for i in slowed], own)
    # and so many of them that with them in, the mean step would move past the 1% bound checked above
    assert len(slowed) * gap / (len(own) + len(slowed)) > 0.01 * statistics.fmean(own), (slowed, own)
    assert all(r["code"] != "LOOP_OVERHEAD" for r in summary["recommendations"]), summary["recommendations"]
    assert summary["gpu"] is None and summary["kernel_windows"]["steps"] == len(held)
    if calls is not None:  # off the thread: the start and the GIL's hold, as the script's recorder read them
        # (a fixed bound failed: 801 ms beside the suite in a fresh-clone CI, where 319 had passed), never the stop
        _paid_start_and_hold(cupti_like.read_calls(calls), summary["kernel_windows"]["cost_ms"] / 1e3)
    else:
        assert summary["kernel_windows"]["cost_ms"] >= 600


@PATHS
def test_run_records_its_window_after_the_measured_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off_thread: bool
) -> None:
    own_file = tmp_path / "own.txt"
    for k, v in {**RECORDER, "WINDOW_COST_OWN": str(own_file)}.items():
        monkeypatch.setenv(k, v)
    calls = _off_thread(monkeypatch, tmp_path) if off_thread else None
    out = tmp_path / "run"
    res = stallscope("run", str(SCENARIO), "--steps", "30", "--no-live", "--json", "--out", str(out), fresh=True)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    starts = [float(x) for x in own_file.read_text().split()]
    rec = load_run(out)
    assert len(starts) == len(rec.steps) == 2 + 30 + 10  # warm-up, measured, the tail window's
    own = {i: starts[i + 1] - starts[i] for i in range(len(starts) - 1)}
    _within_1pct_of_own(out, own, summary, calls)
    assert rec.meta["kernel_window_tail_from"] == 32 and summary["steps"] == 30


@PATHS
def test_run_command_holds_the_scripts_window_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, off_thread: bool
) -> None:
    for k, v in RECORDER.items():
        monkeypatch.setenv(k, v)
    # off the thread: the start-up module's window thread (its own copy of core.kernel_windows.windows's)
    calls = _off_thread(monkeypatch, tmp_path) if off_thread else None
    out, own_file = tmp_path / "run", tmp_path / "own.json"
    # 150 steps. The figures are checked over the measured steps against the loop's own clock, and where the loop
    # is held up between its reading and stallscope's at the first step after a window, that moves the two sums
    # apart by the delay: 4.5 ms in a fresh-clone CI at 60 steps on the thread (38 measured, their mean -1.5%;
    # later boundaries' delays of 2.6-5 ms cancel between neighbours). Over about 120 measured steps of ~7 ms such
    # a delay is 0.5%. Off the thread the loop goes on through the stop's 600 ms (about 85 steps, held), and at 60
    # steps 8 were left, where one such delay moved their mean 5% beside the suite.
    n = 150
    res = stallscope(
        "run", "--json", "--no-live", "--out", str(out), "--", sys.executable, str(SCRIPT), "--steps", str(n),
        "--own", str(own_file), fresh=True,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)
    asked = json.loads(own_file.read_text())["asked"]
    rec = load_run(out)
    assert len(rec.steps) == n == len(asked) - 1 and rec.steps[0].step == 0
    own = {i: asked[i + 1] - asked[i] for i in range(len(asked) - 1)}
    _within_1pct_of_own(out, own, summary, calls)
    (w,) = rec.windows
    assert math.isnan(w.recorded_end) != off_thread  # the calls after the boundary: held, not recorded


def test_a_recorder_that_cannot_be_had_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALLSCOPE_KERNEL_RECORDER", "no_such_module:Recorder")
    res = stallscope("run", str(SCENARIO), "--steps", "2", "--no-live", "--out", str(tmp_path / "r"), fresh=True)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "STALLSCOPE_KERNEL_RECORDER='no_such_module:Recorder'" in lines[0], res.stderr
    assert "MODULE:FACTORY" in lines[0] and "Traceback" not in res.stderr


def test_a_window_stopped_off_the_thread_keeps_only_the_activities_of_the_steps_it_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop runs on after the window's boundary while the loop goes on: the kernels launched after it (40 in
    the fake) are dropped, the store keeps where the recorded steps ended, and the device's split covers only the
    steps before it."""
    monkeypatch.setenv(cupti_like.ENV, OFF_THREAD + ",acts=40")
    summary, _, _ = _loop(tmp_path, 60, steps=None)
    rec = load_run(tmp_path)
    (w,) = rec.windows
    assert w.t_start < w.recorded_end < w.t_end and w.t_recorded == w.recorded_end
    assert len(w.activities) == 40 and all(a[4] <= w.recorded_end for a in w.activities)
    assert summary.gpu is not None
    split = {g.step for g in summary.gpu.steps}
    by_step = {st.step: st for st in rec.steps}
    assert split and all(by_step[i].t_end <= w.recorded_end for i in split)
    after = [st for st in rec.steps if w.recorded_end < st.t_start and st.t_end <= w.t_end]
    assert after and not split & {st.step for st in after}  # held, not measured on the device
