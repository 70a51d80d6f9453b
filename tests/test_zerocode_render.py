"""Reports of a recorded zero-code run (examples/train.py with 2 workers under `stallscope run --`, py-spy at
25 Hz): what is estimated is shown with its interval, what was not measured is not shown as measured."""

from __future__ import annotations

import io
import math
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console

from profiler.analysis import summarize
from profiler.core.store import load_run
from profiler.render.html import write_html
from profiler.render.report import render_report

RUN = Path(__file__).parent / "data" / "runs" / "zero-code-workers"


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    d = tmp_path / "run"
    shutil.copytree(RUN, d)
    return d


def test_summary_of_a_zero_code_run(run_dir: Path) -> None:
    s = summarize(load_run(run_dir))
    assert s.mode == "zero-code" and s.status == "complete" and s.command_exit_code == 0
    assert s.steps == 0 and math.isnan(s.throughput_samples_per_s)  # not measured, not guessed
    assert s.stack_estimate is not None
    est = s.stack_estimate.overall
    assert est is not None
    dw = est.data_wait
    assert est.samples > 300 and dw.low <= dw.fraction <= dw.high
    assert s.stall_fraction == pytest.approx(dw.fraction + est.h2d.fraction)
    assert s.workers == 2  # seen under the training process, not configured
    att = s.loader_attribution
    assert att is not None and att.workers == 2
    shares = {c: v.share.fraction for c, v in att.categories}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert max(shares, key=shares.get) == "augment"
    assert "LOADER_HOTSPOT" in [r.code for r in s.recommendations]


def test_terminal_report_shows_estimates_not_a_breakdown(run_dir: Path) -> None:
    buf = io.StringIO()
    render_report(summarize(load_run(run_dir)), Console(file=buf, width=120, color_system=None))
    text = buf.getvalue()
    assert "Main thread, estimated from" in text and "95% interval" in text
    assert "Loader workers' CPU (2 worker(s)" in text
    assert "Per-step breakdown" not in text
    assert "samples/s" not in text and "step time  " not in text
    assert "zero-code run: step time, throughput and the per-step breakdown need instrumentation" in text


def test_html_report_has_estimate_and_attribution_sections(run_dir: Path, tmp_path: Path) -> None:
    rec = load_run(run_dir)
    page = write_html(summarize(rec), rec, tmp_path / "r.html").read_text()
    ids: set[str] = set()

    class Ids(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            ids.update(v for k, v in attrs if k == "id" and v)

    Ids().feed(page)
    assert {"estimate", "attribution", "verdict", "recommendations"} <= ids
    assert "breakdown" not in ids
