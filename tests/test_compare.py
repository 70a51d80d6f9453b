"""Run comparison: known changes against known limits, direction of every row, and the rendered text.

Summaries are built from a known record and then given exact figures with dataclasses.replace, so the
expected drop (12%) and stall rise (8 pp) are ground truth, not measurements.
"""

from __future__ import annotations

import dataclasses
import io
import math
import shutil
from pathlib import Path

import pytest
from rich.console import Console

from profiler.analysis import Summary, summarize
from profiler.analysis.compare import Comparison, compare
from profiler.analysis.parts import Breakdown, StepTimes
from profiler.core.store import PhaseRow, RunRecord, StepRow, load_run
from profiler.render.compare import render_compare

RUNS = Path(__file__).parent / "data" / "runs"


def base_summary() -> Summary:
    steps, phases = [], []
    for i in range(11):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.03, 8, i == 0))
        phases.append(PhaseRow(i, "h2d", 0, t + 0.03, t + 0.04))
        phases.append(PhaseRow(i, "compute", 0, t + 0.04, t + 0.09))
    meta = {
        "schema_version": 1, "run_id": "aaa", "scenario": "known", "pipeline": "naive", "batch_size": 8,
        "workers": 0, "status": "complete", "device": {"kind": "cpu", "torch_device": "cpu", "name": "Test CPU"},
    }  # fmt: skip
    return summarize(RunRecord(meta, steps, phases, [], []))


def pair() -> tuple[Summary, Summary]:
    """A: 100 samples/s, stall 10%. B: 88 samples/s (12% drop), stall 18% (8 pp rise), 4 workers."""
    s = base_summary()
    a = dataclasses.replace(
        s,
        throughput_samples_per_s=100.0,
        stall_fraction=0.10,
        step_time_ms=StepTimes(mean=80.0, p50=79.0, p90=90.0),
        breakdown_ms_per_step=Breakdown(data_wait=6.0, h2d=2.0, compute=70.0, other=2.0),
        device_busy_fraction=0.875,
        verdict="moderately input-bound",
    )
    b = dataclasses.replace(
        s,
        run_id="bbb",
        workers=4,
        throughput_samples_per_s=88.0,
        stall_fraction=0.18,
        step_time_ms=StepTimes(mean=90.0, p50=79.5, p90=99.0),
        breakdown_ms_per_step=Breakdown(data_wait=14.2, h2d=2.0, compute=70.0, other=3.8),
        device_busy_fraction=0.80,
        verdict="moderately input-bound",
    )
    return a, b


def render(cmp: Comparison) -> str:
    buf = io.StringIO()
    render_compare(cmp, Console(file=buf, width=100, color_system=None, legacy_windows=False))
    return buf.getvalue()


def test_throughput_limit_regresses_at_10_not_at_15() -> None:
    a, b = pair()
    hit = compare(a, b, max_stall_increase_pp=None, max_throughput_drop_pct=10)
    assert hit.regressed
    assert [r.metric for r in hit.regressions] == ["throughput"]
    reason = hit.regressions[0].reason
    assert reason == "throughput dropped 12.0% (100.0 -> 88.0 samples/s), beyond the limit of 10%"
    assert "\n" not in reason
    assert hit.regressions[0].change == pytest.approx(12.0)
    assert not compare(a, b, max_stall_increase_pp=None, max_throughput_drop_pct=15).regressed
    # a drop equal to the limit is not beyond it
    assert not compare(a, b, max_stall_increase_pp=None, max_throughput_drop_pct=12).regressed


def test_stall_limit_regresses_at_5_not_at_10() -> None:
    a, b = pair()
    hit = compare(a, b, max_stall_increase_pp=5, max_throughput_drop_pct=None)
    assert [r.reason for r in hit.regressions] == [
        "stall fraction rose 8.0 pp (10.0% -> 18.0%), beyond the limit of 5 pp"
    ]
    assert not compare(a, b, max_stall_increase_pp=10, max_throughput_drop_pct=None).regressed
    assert not compare(a, b, max_stall_increase_pp=8, max_throughput_drop_pct=None).regressed
    both = compare(a, b, max_stall_increase_pp=5, max_throughput_drop_pct=10)
    assert [r.metric for r in both.regressions] == ["throughput", "stall fraction"]


def test_no_limits_never_regress() -> None:
    a, b = pair()
    cmp = compare(a, b, max_stall_increase_pp=None, max_throughput_drop_pct=None)
    assert not cmp.regressed and cmp.regressions == [] and cmp.unchecked == []
    assert not compare(a, b).regressed
    # B better than A never regresses, whatever the limits
    assert not compare(b, a, max_stall_increase_pp=0, max_throughput_drop_pct=0).regressed


def test_rows_directions_and_deltas() -> None:
    a, b = pair()
    cmp = compare(a, b, max_stall_increase_pp=None, max_throughput_drop_pct=None)
    t = cmp.row("throughput")
    assert (t.a, t.b, t.delta, t.unit, t.change) == (100.0, 88.0, -12.0, "samples/s", "worse")
    assert t.delta_pct == pytest.approx(-12.0)
    s = cmp.row("stall fraction")
    assert (s.a, s.b, s.unit, s.change) == (10.0, 18.0, "%", "worse")
    assert s.delta == pytest.approx(8.0)
    assert cmp.row("step time mean").change == "worse"
    assert cmp.row("step time p50").change == "same"  # +0.6%: within the 1% noise band
    assert cmp.row("data_wait / step").delta == pytest.approx(8.2)
    assert cmp.row("compute / step").change == "same"
    busy = cmp.row("device busy")
    assert busy.change == "worse" and busy.delta == pytest.approx(-7.5)
    assert cmp.row("verdict").change == "same"
    assert cmp.row("workers").change == "changed" and (cmp.row("workers").a, cmp.row("workers").b) == (0, 4)
    assert cmp.row("scenario").change == "same"
    assert cmp.row("device").a == "cpu (Test CPU)"
    reverse = compare(b, a)
    assert reverse.row("throughput").change == "better" and reverse.row("stall fraction").change == "better"
    assert reverse.row("device busy").change == "better" and reverse.row("step time mean").change == "better"
    metrics = [r.metric for r in cmp.rows]
    assert metrics.index("data_wait / step") < metrics.index("h2d / step") < metrics.index("other / step")


def test_verdict_more_input_bound_is_worse() -> None:
    a, b = pair()
    worse = compare(a, dataclasses.replace(b, verdict="highly input-bound"))
    assert worse.row("verdict").change == "worse"
    better = compare(a, dataclasses.replace(b, verdict="not input-bound"))
    assert better.row("verdict").change == "better"
    unknown = compare(a, dataclasses.replace(b, verdict="unknown: no measured steps"))
    assert unknown.row("verdict").change == "not comparable"


def test_dicts_and_summaries_compare_alike() -> None:
    a, b = pair()
    kw = {"max_stall_increase_pp": 5.0, "max_throughput_drop_pct": 10.0}
    assert compare(a.to_dict(), b.to_dict(), **kw) == compare(a, b, **kw)
    assert compare(a, b.to_dict(), **kw).to_dict()["regressed"] is True
    with pytest.raises(TypeError, match=r"run B must be a Summary or a summary\.json dict"):
        compare(a, "b.json", **kw)  # type: ignore[arg-type]


def test_nan_or_missing_figures_cannot_regress_and_say_so() -> None:
    a, b = pair()
    nan_b = dataclasses.replace(b, throughput_samples_per_s=math.nan, stall_fraction=math.nan)
    cmp = compare(a, nan_b, max_stall_increase_pp=0, max_throughput_drop_pct=0)
    assert not cmp.regressed
    assert cmp.row("throughput").change == "not comparable" and cmp.row("throughput").b is None
    assert cmp.row("stall fraction").change == "not comparable"
    assert cmp.unchecked == [
        "throughput not checked against the 0% drop limit: not measured in run B",
        "stall fraction not checked against the 0 pp limit: not measured in run B",
    ]
    d = a.to_dict()
    d["throughput_samples_per_s"] = None
    del d["stall_fraction"]
    cmp = compare(d, b, max_stall_increase_pp=1, max_throughput_drop_pct=1)
    assert not cmp.regressed and len(cmp.unchecked) == 2
    text = render(cmp)
    assert "not comparable" in text and "not measured in run A" in text
    assert "n/a" in text


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_stall_increase_pp": -1.0}, "max stall increase must be a number of percentage points >= 0, got -1.0"),
        ({"max_throughput_drop_pct": -0.5}, "max throughput drop must be a number of percent >= 0, got -0.5"),
        ({"max_throughput_drop_pct": math.nan}, "max throughput drop must be a number of percent >= 0, got nan"),
    ],
)
def test_negative_or_nan_limits_are_refused(kw: dict[str, float], message: str) -> None:
    a, b = pair()
    with pytest.raises(ValueError) as err:
        compare(a, b, **kw)
    assert str(err.value) == message


def test_rendered_table_has_the_exact_figures_and_regressions() -> None:
    a, b = pair()
    text = render(compare(a, b, max_stall_increase_pp=5, max_throughput_drop_pct=10))
    for figure in [
        "100.0 samples/s",
        "88.0 samples/s",
        "-12.0 (-12.0%)",
        "10.0%",
        "18.0%",
        "+8.0 pp",
        "80.00 ms",
        "90.00 ms",
        "+10.00 (+12.5%)",
        "87.5%",
        "-7.5 pp",
        "▼ worse",
        "= same",
        "≠ changed",
    ]:
        assert figure in text, figure
    assert "REGRESSION beyond the limits (max stall increase 5 pp, max throughput drop 10%):" in text
    assert "throughput dropped 12.0% (100.0 -> 88.0 samples/s), beyond the limit of 10%" in text
    assert "stall fraction rose 8.0 pp (10.0% -> 18.0%), beyond the limit of 5 pp" in text
    assert "no regression" not in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_rendered_pass_says_no_regression() -> None:
    a, b = pair()
    text = render(compare(a, b, max_stall_increase_pp=10, max_throughput_drop_pct=15))
    assert "no regression beyond the limits (max stall increase 10 pp, max throughput drop 15%)" in text
    assert "REGRESSION" not in text
    assert "no regression beyond the limits (no limits given)" in render(compare(a, b))
    assert "▲ better" in render(compare(b, a))


def test_recorded_runs_compare(tmp_path: Path) -> None:
    for name in ("cpu-workers", "nvml-fake", "interrupted"):
        shutil.copytree(RUNS / name, tmp_path / name)
    cpu = summarize(load_run(tmp_path / "cpu-workers"))
    nvml = summarize(load_run(tmp_path / "nvml-fake"))
    killed = summarize(load_run(tmp_path / "interrupted"))
    cmp = compare(cpu, nvml, max_stall_increase_pp=5, max_throughput_drop_pct=10)
    # workers 2 -> 0 on a loader of 5 ms per item: the input stall grows and throughput falls
    assert cmp.regressed and {r.metric for r in cmp.regressions} == {"throughput", "stall fraction"}
    assert cmp.row("workers").change == "changed"
    assert cmp.row("status").b == "complete"
    assert compare(cpu, killed).row("status").b == "interrupted"
    assert not compare(cpu, cpu, max_stall_increase_pp=0, max_throughput_drop_pct=0).regressed
    render(cmp)
