"""Zero-code profiling of a torchrun job: each rank found from its environment, its data-wait estimate checked
against the rank's own measured figure, its loader workers attributed apart from the other rank's.

One job is run for the module (tests/data/ddp_straggler.py, 2 ranks x 1 worker, gloo, about 7 s of training):
rank 1's items sleep 6 ms in ``slow_read`` on top of the ``augment`` work every item does, so rank 1 waits for
data most of the time and rank 0 waits for rank 1 in DDP's all-reduce instead. Each rank writes its own
data-wait fraction (time in iter()/next() over its loop): the ground truth.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stallscope
from rich.console import Console

from profiler.analysis import summarize
from profiler.core.store import load_run
from profiler.render.html import write_html
from profiler.render.sampled import render_job
from profiler.zerocode.analysis import zero_code_job

SCRIPT = str(ROOT / "tests" / "data" / "ddp_straggler.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
# ~650-770 main-thread samples per rank at 100 Hz over ~7 s (over 4 s, ~370-440: a stress run read rank 0 7.04 pp
# off, 3.4 sd there); beside two busy processes py-spy kept 459 over 7 s in stress run 48 (66 a second), so the job
# runs 9 s. The shares here are near 0.1 and 0.85, where the binomial sd at n >= 500 is <= 1.6 pp: the
# bound is 4.4 sd; the estimate's window (the second step's first loader sample to the last loader-or-compute
# sample) and the script's (its second step's next() to its loop's end) differ by a few samples at each end.
# Measured errors (estimate - truth over the whole loop, before the first step was left out), py-spy real-time
# (core.sampling.pyspy.OnTime): beside two busy processes rank 0 -1.35, -1.44, -0.55 pp and rank 1 -0.43, +0.45, -1.83
# pp; beside three, rank 0 -2.1 to +4.2, rank 1 -1.2 to +2.6 pp; at normal priority rank 1 read +4.3 to +7 pp high
# beside two. Three runs read rank 0 +8.6 to +8.9 pp high: py-spy's samples made up in the first step (its span
# now leaves that step out: docs/zero-code.md).
TOLERANCE = 0.07
MIN_RANK_SAMPLES = 500
# The start-up module's per-rank figures against the script's own (after its first step): measured -0.11 pp
# (both ranks) on a quiet host, -0.20 to +0.13 pp beside two busy processes (3 runs).
MEASURED_TOLERANCE = 0.03


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("py-spy") is None and not (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy is not installed")
    tmp = tmp_path_factory.mktemp("ranks")
    out = tmp / "run"
    res = stallscope(
        "run", "--json", "--no-live", "--pyspy-rate", "100", "--out", str(out), "--",
        *TORCHRUN, SCRIPT, "--slow-rank", "1", "--sleep-ms", "6", "--seconds", "9", "--truth", str(tmp),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    truth = {r: json.loads((tmp / f"truth-rank{r}.json").read_text()) for r in (0, 1)}
    return {"summary": json.loads(res.stdout), "truth": truth, "out": out, "stderr": res.stderr}


def _rows(job: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in job["summary"]["ranks"]}


# alone (tests/scheduling.py), the first of the file's tests, in which the module's job runs: py-spy at 100 Hz pauses
# five processes a sample, and their threads must get a CPU for it. Beside the suite's multi-rank docs commands a
# CI run's py-spy fell 7.2 s behind its schedule (27 reports; the run's own note said so), rank 0 kept 123 samples
# against the 500 the bound needs, and neither worker was sampled at all. Beside two busy loops (stress run 32,
# five passes) it kept up well enough
@pytest.mark.alone
def test_both_ranks_are_identified_from_their_environment(job: dict[str, Any]) -> None:
    rows = _rows(job)
    assert sorted(rows) == [0, 1]
    for rank, row in rows.items():
        assert row["pid"] == job["truth"][rank]["pid"]  # the process that said it was rank R
        assert row["local_rank"] == rank and row["world_size"] == 2 and row["node_rank"] == 0
    assert job["summary"]["job"]["world_size"] == 2 and job["summary"]["job"]["ranks_seen"] == 2


def test_each_ranks_data_wait_estimate_matches_its_own_measurement(job: dict[str, Any]) -> None:
    rows = _rows(job)
    for rank, row in rows.items():
        est, truth = row["data_wait_fraction"], job["truth"][rank]["data_wait_fraction_after_first_step"]
        assert row["main_thread_samples"] >= MIN_RANK_SAMPLES, row["main_thread_samples"]
        # on failure, whether py-spy said it fell behind its schedule (the notes: docs/zero-code.md, "Falling behind")
        assert abs(est["fraction"] - truth) <= TOLERANCE, (rank, est, truth, job["summary"]["notes"])
    # the injected straggler: rank 1 waits for data, rank 0 does not (it waits in rank 1's all-reduce), by more than
    # the two estimates' tolerances together, so that the check above tells the ranks apart. (A fixed 0.6 between
    # them failed in a CI run: beside the suite rank 1's own figure read 0.56, its augment work and compute
    # stretched as well.)
    waits = [job["truth"][r]["data_wait_fraction_after_first_step"] for r in (0, 1)]
    assert waits[1] - waits[0] > 2 * TOLERANCE, waits
    assert rows[1]["data_wait_fraction"]["low"] > rows[0]["data_wait_fraction"]["high"]
    assert rows[1]["verdict"] == "highly input-bound"
    straggler = job["summary"]["straggler"]
    assert straggler["rank"] == 1 and "rank 1's main thread waited for data" in straggler["evidence"]


def test_loader_workers_are_attributed_per_rank(job: dict[str, Any]) -> None:
    rows = _rows(job)
    cats = {r: rows[r]["loader_attribution"]["categories"] for r in rows}
    for r in rows:
        assert rows[r]["workers"] == 1 and rows[r]["loader_attribution"]["workers"] == 1
    # rank 1's worker mostly sleeps in slow_read (a file-read name); rank 0's worker only augments
    assert cats[1]["file_read"]["fraction"] > 0.5, cats[1]
    assert cats[1]["file_read"]["top"][0]["function"].startswith("slow_read")
    assert cats[0]["file_read"]["fraction"] == 0.0
    assert rows[0]["top_loader_frames"][0]["function"].startswith("augment")
    assert rows[1]["top_loader_frames"][0]["function"].startswith("slow_read")
    assert rows[0]["main_cpu_pct"] > 0 and rows[1]["workers_cpu_pct"] >= 0


def test_each_rank_has_its_own_measured_step_figures(job: dict[str, Any]) -> None:
    s = job["summary"]
    for row in s["ranks"]:
        truth = job["truth"][row["rank"]]
        # the start-up module's figures: the measured steps (all but the warm-up step and the last, unended one)
        assert row["steps"] == truth["steps"] - 2, (row["steps"], truth["steps"])
        measured = row["data_wait_ms"] / row["step_time_ms"]
        assert abs(measured - truth["steady_data_wait_fraction"]) <= MEASURED_TOLERANCE, (row, truth)
        assert row["throughput_samples_per_s"] > 0
        for key in ("sync_ms_per_step", "device_busy_fraction", "breakdown_ms_per_step"):
            assert row[key] is None  # not measured per rank, and said so
    assert "not measured per rank" in s["job"]["not_measured"]
    assert s["mode"] == "auto-instrumented" and s["steps"] == job["truth"][0]["steps"] - 2  # the run's: rank 0's
    # the job's own estimate pools the ranks' main threads, never the launcher's
    pooled = s["stack_estimate"]["overall"]
    assert pooled["samples"] == sum(r["main_thread_samples"] for r in s["ranks"])
    assert pooled["data_wait"]["samples"] == sum(r["data_wait_fraction"]["samples"] for r in s["ranks"])
    assert s["loader_attribution"]["workers"] == 2
    stored = json.loads((job["out"] / "summary.json").read_text())
    assert [r["rank"] for r in stored["ranks"]] == [0, 1]


def test_the_ranks_table_is_rebuilt_from_the_store(job: dict[str, Any]) -> None:
    built = zero_code_job(load_run(job["out"]))
    assert built is not None and [r.rank for r in built.ranks] == [0, 1]
    buf = io.StringIO()
    render_job(built, Console(file=buf, width=160, color_system=None))
    text = buf.getvalue()
    assert "Ranks (2 of world size 2)" in text and "step figures measured in each rank" in text
    assert "rank 1's main thread waited for data an estimated" in text
    assert "slow_read" in text and "augment" in text
    rec = load_run(job["out"])
    assert str(rec.meta["pyspy_scheduling"]).startswith(("SCHED_FIFO", "normal priority"))
    page = write_html(summarize(rec), rec, job["out"] / "report.html").read_text()
    assert '<section id="ranks">' in page and 'data-rank="1"' in page and "slow_read" in page
