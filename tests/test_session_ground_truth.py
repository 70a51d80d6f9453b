"""Session figures against injected ground truth: loaders and phases made of known sleeps."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import Truth, near, sleep_loader

from profiler import Session
from profiler.analysis import Summary, summarize
from profiler.core.store import load_run


def _run(
    tmp: Path,
    *,
    wait: float,
    h2d: float,
    compute: float,
    other: float = 0.0,
    steps: int = 20,
    warmup: int = 2,
    workers: int | None = None,
    sources: list | None = None,
    truth: Truth | None = None,
) -> tuple[Summary, dict[str, float]]:
    """Run a loop of injected sleeps; return the summary and what each part really took (ms per measured step)."""
    truth = truth if truth is not None else Truth()
    with Session(tmp, warmup=warmup, sources=sources, meta={"workers": workers}) as s:
        for _batch in s.wrap(sleep_loader(steps + warmup, wait, truth=truth)):
            if h2d:
                with s.phase("h2d"):
                    truth.sleep("h2d", h2d)
            with s.phase("compute"):
                truth.sleep("compute", compute)
            # "other" is the loop's time outside the phases: from here to the next next(), the injected sleep and
            # the loop's own lines around it (beside two busy processes the thread waited for a CPU between them:
            # 15.90 ms of other against 15.13 of sleep alone)
            truth.sleep("other", other)
    parts = {k: truth.mean_ms(k, skip=warmup) for k in ("data_wait", "h2d", "compute", "other")}
    parts["step"] = sum(parts.values())
    return s.summary(), parts


def test_phase_times_and_stall_fraction_match_injected_sleeps(tmp_path: Path) -> None:
    truth = Truth()
    s, t = _run(tmp_path, wait=0.030, h2d=0.020, compute=0.040, truth=truth)  # sources: host, sched, nvml (absent)
    b = s.breakdown_ms_per_step
    assert s.steps == 20 and s.warmup_steps == 2
    # each measured span holds its truth's and a few lines around it: a preemption there, beside busy processes,
    # is the measurement's own time (a stress pass: 57.9 ms of data wait against 48.5 in the loader's next()), so
    # the comparison takes out the run-queue wait the measured span had beyond the truth's (schedstat, both)
    run = load_run(tmp_path)
    waits = [st.data_wait_runq_s for st in run.steps]
    outside = {"data_wait": truth.outside_ms("data_wait", waits, skip=2)}
    for part in ("h2d", "compute"):
        outside[part] = truth.outside_ms(part, [p.runq_s for p in run.phases if p.name == part], skip=2)
    for part in ("data_wait", "h2d", "compute"):
        assert near(b[part] - outside[part], t[part]), (part, b, t, outside)
    stall = (t["data_wait"] + t["h2d"]) / t["step"]
    assert abs(s.stall_fraction - stall) <= 0.01, (s.stall_fraction, stall)
    assert near(s.step_time_ms.mean, t["step"])
    assert s.throughput_samples_per_s == pytest.approx(8e3 / t["step"], rel=0.03)
    assert s.device_busy_fraction == pytest.approx(t["compute"] / t["step"], abs=0.01)
    assert b["other"] < 1.0  # nothing else ran in the loop
    assert s.verdict == "highly input-bound"
    assert s.status == "complete"
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk == s.to_dict()


# docs/metrics.md's bands of the stall: >= 20% highly, >= 5% moderately, below that not input-bound
BANDS = ((0.20, "highly input-bound"), (0.05, "moderately input-bound"), (0.0, "not input-bound"))


def bands_of(stall: float, slack: float) -> set[str]:
    """The verdicts docs/metrics.md gives a stall within ``slack`` of ``stall`` (two near a band's edge)."""
    return {next(name for edge, name in BANDS if x >= edge) for x in (max(0.0, stall - slack), stall + slack)}


@pytest.mark.parametrize(
    ("wait", "compute", "verdict"),
    [
        (0.018, 0.032, "highly input-bound"),  # 36%: each case sits well inside its band
        (0.008, 0.092, "moderately input-bound"),  # 8%
        (0.0, 0.030, "not input-bound"),  # ~0%
    ],
)
def test_each_verdict_band(tmp_path: Path, wait: float, compute: float, verdict: str) -> None:
    """The verdict is the band of the stall the run really had. A loaded host stretches every injected sleep by its
    wake-up latency, the short waits most: 6 ms of wait beside 44 ms of compute (12%) read above 20% in a stress
    pass, the measured stall within 0.01 of the truth and rightly "highly". So the band comes from the truth, and
    the moderate case is 8 ms beside 92 ms, which stays in its band up to 20 ms of added latency a sleep."""
    s, t = _run(tmp_path, wait=wait, h2d=0.0, compute=compute, steps=15, sources=[])
    stall = t["data_wait"] / t["step"]
    assert abs(s.stall_fraction - stall) <= 0.01
    assert s.verdict in bands_of(stall, 0.01), (s.verdict, stall, verdict)
    codes = [r.code for r in s.recommendations]
    assert ("NOT_INPUT_BOUND" in codes) == (s.verdict == "not input-bound")


def test_unmeasured_loop_time_is_other_and_recommended(tmp_path: Path) -> None:
    truth = Truth()
    s, t = _run(tmp_path, wait=0.0, h2d=0.0, compute=0.020, other=0.015, steps=15, sources=[], truth=truth)
    # as for the phases above: what the measured "other" waited for a CPU beyond the truth's own span is the
    # measurement's (a stress pass: 16.42 ms of other against 15.67 of sleep); the step's run-queue wait less its
    # data wait's and its phases' is the other's
    run = load_run(tmp_path)
    other_runq = [
        st.runq_s - st.data_wait_runq_s - sum(p.runq_s or 0.0 for p in run.phases if p.step == st.step and p.depth == 0)
        if st.runq_s is not None and st.data_wait_runq_s is not None
        else None
        for st in run.steps
    ]
    outside = truth.outside_ms("other", other_runq, skip=2)
    assert near(s.breakdown_ms_per_step["other"] - outside, t["other"]), (s.breakdown_ms_per_step, t, outside)
    rec = {r.code: r.text for r in s.recommendations}
    assert "LOOP_OVERHEAD" in rec
    assert f"{s.breakdown_ms_per_step['other']:.1f} ms" in rec["LOOP_OVERHEAD"]  # cites the measured figure


def test_input_bound_with_zero_workers_recommends_workers_citing_the_wait(tmp_path: Path) -> None:
    s, t = _run(tmp_path, wait=0.020, h2d=0.0, compute=0.020, steps=12, workers=0, sources=[])
    assert near(s.breakdown_ms_per_step["data_wait"], t["data_wait"])
    rec = {r.code: r.text for r in s.recommendations}
    assert "RAISE_WORKERS" in rec
    assert f"{s.breakdown_ms_per_step['data_wait']:.1f} ms" in rec["RAISE_WORKERS"]
    assert "num_workers=0" in rec["RAISE_WORKERS"]


def test_user_phases_and_nesting(tmp_path: Path) -> None:
    truth = Truth()
    with Session(tmp_path, sources=[], warmup=1) as s:
        for _ in s.wrap(sleep_loader(6, 0.0)):
            with s.phase("compute"):
                with s.phase("forward"):
                    truth.sleep("forward", 0.020)
                truth.sleep("compute", 0.010)
            with s.phase("log"):
                truth.sleep("log", 0.025)
    summ = s.summary()
    b = summ.breakdown_ms_per_step
    assert near(b["compute"], truth.mean_ms("forward", skip=1) + truth.mean_ms("compute", skip=1)), b
    assert near(b["log"], truth.mean_ms("log", skip=1)), b
    assert "compute/forward" not in b  # nested phases are stored, not double counted
    names = {p.name for p in load_run(tmp_path).phases}
    assert names == {"compute", "compute/forward", "log"}


def test_unmatched_phase_exit_raises(tmp_path: Path) -> None:
    with Session(tmp_path, sources=[]) as s:
        outer, inner = s.phase("a"), s.phase("b")
        outer.__enter__()
        inner.__enter__()
        with pytest.raises(ValueError, match="innermost open phase"):
            outer.__exit__(None, None, None)


def test_break_out_of_loop_ends_the_step_and_failure_is_recorded(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), Session(tmp_path, sources=[]) as s:
        for i, _ in enumerate(s.wrap(sleep_loader(50, 0.001))):
            with s.phase("compute"):
                time.sleep(0.002)
            if i == 7:
                raise RuntimeError("boom")
    rec = load_run(tmp_path)
    assert len(rec.steps) == 8
    summ = summarize(rec)
    assert summ.status == "failed"
    assert "RuntimeError: boom" in (summ.error or "")
    assert "test_session_ground_truth.py" in (summ.error or "")


def test_batch_size_inferred_from_tensors_and_dataloader_knobs(tmp_path: Path) -> None:
    import torch

    ds = torch.utils.data.TensorDataset(torch.zeros(40, 3), torch.zeros(40))
    dl = torch.utils.data.DataLoader(ds, batch_size=10, num_workers=0)
    with Session(tmp_path, sources=[]) as s:
        for _ in s.wrap(dl):
            pass
    summ = s.summary()
    assert summ.samples_measured == 40
    assert summ.workers == 0 and summ.batch_size == 10 and summ.pin_memory is False


def test_warmup_only_run_reports_no_figures(tmp_path: Path) -> None:
    with Session(tmp_path, sources=[], warmup=10) as s:
        for _ in s.wrap(sleep_loader(3, 0.0)):
            pass
    summ = s.summary()
    assert summ.steps == 0 and summ.warmup_steps == 3
    assert summ.verdict.startswith("unknown")
    assert summ.to_dict()["stall_fraction"] is None
    assert summ.notes
