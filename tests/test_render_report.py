"""The terminal report, rendered from a known run record into a capture console, compared as exact text."""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from profiler.analysis import summarize
from profiler.core.store import PhaseRow, RunRecord, StepRow
from profiler.render.report import render_report

GOLDEN = Path(__file__).parent / "data" / "report_golden.txt"


def known_record(status: str = "complete", error: str | None = None) -> RunRecord:
    """10 steps of 100 ms: 30 ms data wait, 10 ms h2d, 50 ms compute, 10 ms unaccounted; 1 warm-up step."""
    steps, phases, samples = [], [], []
    for i in range(11):
        t = i * 0.1
        steps.append(StepRow(i, t, t + 0.1, 0.03, 8, i == 0))
        phases.append(PhaseRow(i, "h2d", 0, t + 0.03, t + 0.04))
        phases.append(PhaseRow(i, "compute", 0, t + 0.04, t + 0.09))
    for k in range(11):
        t = k * 0.1
        samples += [
            (t, "sampler", "sampler.lateness_ms", 0.5),
            (t, "sampler", "sampler.read_ms", 0.4),
            (t, "host", "proc.main.cpu_pct", 95.0),
            (t, "host", "proc.total.cpu_pct", 95.0),
            (t, "host", "proc.total.rss_mb", 512.0),
            (t, "host", "sys.cpu_pct", 60.0),
        ]
    meta = {
        "schema_version": 1,
        "run_id": "abc123def456",
        "scenario": "known",
        "pipeline": "naive",
        "batch_size": 8,
        "workers": 0,
        "pin_memory": False,
        "warmup_steps": 1,
        "sample_hz": 10.0,
        "cpu_count": 2,
        "device": {"kind": "cpu", "torch_device": "cpu", "name": "Test CPU (2 cores)", "index": None},
        "status": status,
        "error": error,
    }
    events = [
        (0.0, "source", "host", "available"),
        (0.0, "source", "nvml", "unavailable: NVML unavailable: NVMLError_LibraryNotFound (no NVIDIA driver)"),
    ]
    return RunRecord(meta, steps, phases, samples, events)


def render(record: RunRecord) -> str:
    buf = io.StringIO()
    render_report(summarize(record), Console(file=buf, width=100, color_system=None, legacy_windows=False))
    return buf.getvalue()


def test_report_matches_golden_text() -> None:
    text = render(known_record())
    if os.environ.get("STALLSCOPE_UPDATE_GOLDEN"):
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_report_figures_are_the_injected_ones() -> None:
    text = render(known_record())
    assert "80.0 samples/s" in text  # 8 samples per 100 ms step
    assert "│ data_wait │   30.00 │ 30.0% │" in text
    assert "│ other     │   10.00 │ 10.0% │" in text
    assert "Verdict: highly input-bound  (stall 40.0%" in text
    assert "[RAISE_WORKERS] Data wait is 30.0 ms of a 100.0 ms step (30%)" in text
    # no GPU in a CPU run: why NVML read nothing is said once, among the sampler's sources (issue #66)
    assert text.count("NVMLError_LibraryNotFound") == 1 and "source nvml: unavailable: NVML unavailable" in text
    assert "NVML util" not in text


def test_failed_run_says_where_it_stopped() -> None:
    text = render(known_record("failed", "RuntimeError: boom (at train.py:12 in step)"))
    assert "Run stopped: RuntimeError: boom (at train.py:12 in step)" in text
    assert "status=failed" in text
