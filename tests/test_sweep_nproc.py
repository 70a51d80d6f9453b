"""`stallscope sweep --nproc 1,2,...`: the rank-count axis. A configuration of N > 1 ranks runs as a job
(profiler.jobs.launch.run_job) into its own job directory; its row is the job summary's, and the analysis gives each
job's speed-up and scaling efficiency against nproc 1 of the same pipeline, batch and workers.

The end-to-end sweeps use tests/data/scenarios/ranks.py, whose costs are sleeps (1 ms an item, 30 ms a forward):
two ranks on two cores do not slow each other down, so 2 ranks make close to twice the samples/s of one. Each job
costs ~20-40 s here (every rank imports torch), so the CLI tests are few."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import warm
from conftest import ROOT, stallscope, wait_until
from rich.console import Console
from test_cli import assert_one_line_error

from profiler.core.store import load_run
from profiler.jobs.launch import AGENT_SIGNALS, handlers_kept
from profiler.sweep.analysis import Config, SweepRow, analyse_sweep, config_name
from profiler.sweep.render import render_sweep, row_line

RANKS = str(ROOT / "tests" / "data" / "scenarios" / "ranks.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def row(batch: int, thr: float, nproc: int = 1, **kw: Any) -> SweepRow:
    step = batch * nproc / thr * 1e3
    return SweepRow(
        "naive",
        batch,
        0,
        "complete",
        throughput_samples_per_s=thr,
        stall_fraction=0.1,
        device_busy_fraction=0.9,
        step_time_ms={"mean": step, "p50": step, "p90": step},
        breakdown_ms_per_step={"data_wait": 1.0, "h2d": 0.0, "compute": step - 2, "other": 1.0, "sync": 0.0},
        step_time_rel_ci=0.01,
        nproc=nproc,
        sync_ms_per_step=0.0 if nproc > 1 else math.nan,
        **kw,
    )


# -- names, analysis and table on synthetic rows ------------------------------------------------------------


def test_config_names_keep_their_single_rank_form() -> None:
    assert config_name("naive", 16, 2) == "naive-b16-w2" == Config("naive", 16, 2).name
    assert Config("naive", 16, 2, 1).name == "naive-b16-w2"
    assert Config("prefetch", 8, 0, 4).name == "prefetch-b8-w0-x4"


def test_speedup_and_scaling_efficiency_are_the_ratio_of_measured_throughputs() -> None:
    rows = [row(8, 200.0), row(16, 300.0), row(8, 350.0, 2), row(16, 450.0, 2), row(32, 500.0, 2)]
    result = analyse_sweep(rows, scenario="s", device="cpu", planned=5)
    by = {r.name: r for r in result.rows}
    assert math.isnan(by["naive-b8-w0"].speedup) and by["naive-b8-w0"].speedup_baseline is None
    assert by["naive-b8-w0-x2"].speedup == 350.0 / 200.0
    assert by["naive-b8-w0-x2"].scaling_efficiency == 350.0 / 200.0 / 2
    assert by["naive-b16-w0-x2"].speedup_baseline == "naive-b16-w0"
    assert math.isnan(by["naive-b32-w0-x2"].speedup)  # no nproc 1 at batch 32: named in the notes
    assert any("no speed-up for naive-b32-w0-x2" in n for n in result.notes)
    # knees are per pipeline x workers x nproc line
    assert {(k.nproc, k.batch_size) for k in result.knees} == {(1, 16), (2, 32)}
    d = result.to_dict()
    job = next(r for r in d["rows"] if r["config"] == "naive-b8-w0-x2")
    assert {"nproc", "speedup", "scaling_efficiency", "speedup_baseline", "sync_ms_per_step"} <= job.keys()
    assert d["rows"][0]["speedup"] is None and "speedup" in d["rules"]
    single = analyse_sweep(rows[:2], scenario="s", device="cpu", planned=2)
    assert not single.multi_rank and "speedup" not in single.to_dict()["rules"]


def test_the_table_shows_nproc_and_sync_only_when_a_row_is_a_job() -> None:
    def text(rows: list[SweepRow]) -> str:
        out = io.StringIO()
        result = analyse_sweep(rows, scenario="prefetch", device="cpu", planned=len(rows))
        render_sweep(result, Console(file=out, width=80, color_system=None))
        return out.getvalue()

    failed = SweepRow("prefetch", 16, 0, "failed", None, "rank 1 killed by SIGKILL", nproc=2)
    rows = [replace(r, pipeline="prefetch", workers=16) for r in (row(8, 200.0), row(8, 1350.5, 2))]
    jobs = text([*rows, failed])
    table, _, below = jobs.partition("busy: ")
    header = table.split("──")[0]  # the column titles take two lines
    assert "nproc" in header and "sync" in header and "p90" not in header
    assert "…" not in table  # still fits 80 columns
    job_line = next(line for line in table.splitlines() if "1350.5" in line)
    assert job_line.split()[:4] == ["prefetch", "8", "16", "2"] and " 0.0 " in job_line  # nproc, sync
    assert (
        "Scaling (prefetch, 16 workers, batch 8/rank): 2 ranks 1350.5 samples/s vs 1 rank 200.0: speed-up x6.75, "
        "scaling efficiency 337.6%" in " ".join(below.split())
    )
    assert "prefetch-b16-w0-x2 failed: rank 1 killed by SIGKILL" in " ".join(below.split())
    plain = text([row(8, 200.0), row(16, 300.0)])
    assert "nproc" not in plain and "sync" not in plain and "Scaling" not in plain and "p90" in plain
    assert "sum over 2 ranks" in row_line(row(8, 350.0, 2, steps=10, wall_s=3.0))


def test_the_agents_signal_handlers_are_given_back() -> None:
    before = {s: signal.getsignal(s) for s in AGENT_SIGNALS}
    with handlers_kept():
        for s in AGENT_SIGNALS:  # what torch's elastic agent does when it starts the ranks
            signal.signal(s, lambda *_: None)
    assert {s: signal.getsignal(s) for s in AGENT_SIGNALS} == before


# -- end to end ---------------------------------------------------------------------------------------------


def test_two_ranks_sweep_to_about_twice_the_throughput(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    res = stallscope("sweep", RANKS, "--nproc", "1,2", "--workers", "0", "--batch-sizes", "8", "--device", "cpu",
                     "--steps", "30", "--warmup", "3", "--no-live", "--price-per-hour", "3.6",
                     "--out", str(out))  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "stallscope: sweep [2/2] naive-b8-w0-x2" in res.stderr and "sum over 2 ranks" in res.stderr
    d = json.loads((out / "sweep.json").read_text())
    one, two = d["rows"]
    assert (one["config"], one["nproc"], two["config"], two["nproc"]) == ("naive-b8-w0", 1, "naive-b8-w0-x2", 2)
    assert one["status"] == two["status"] == "complete"
    ratio = two["throughput_samples_per_s"] / one["throughput_samples_per_s"]
    assert two["speedup"] == pytest.approx(ratio, rel=1e-12) and ratio > 1.5
    assert two["scaling_efficiency"] == pytest.approx(ratio / 2, rel=1e-12)
    assert two["speedup_baseline"] == "naive-b8-w0"
    assert two["steps"] == 30 and two["stop_reason"] == "steps"  # a job runs the --steps cap
    assert set(two["breakdown_ms_per_step"]) == {"data_wait", "h2d", "compute", "other", "sync"}
    assert two["sync_ms_per_step"] == two["breakdown_ms_per_step"]["sync"]
    # 3.6 per hour = 0.001 per second: the node's cost per 1k samples at the job's throughput
    assert two["cost_per_1k_samples"] == pytest.approx(1 / two["throughput_samples_per_s"], rel=1e-6)
    # the job's throughput is the sum over its ranks, as the job directory's own report says
    job_dir = out / "naive-b8-w0-x2"
    assert two["run_dir"] == str(job_dir) and json.loads((job_dir / "job.json").read_text())["status"] == "complete"
    ranks = [load_run(job_dir / f"rank-{r}").meta for r in (0, 1)]
    assert [(m["rank"], m["world_size"], m["sweep_config"]) for m in ranks] == [
        (0, 2, "naive-b8-w0-x2"),
        (1, 2, "naive-b8-w0-x2"),
    ]
    report = stallscope("report", str(job_dir), "--json")  # the row is the job's own report
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["throughput_samples_per_s"] == pytest.approx(two["throughput_samples_per_s"])
    header = res.stdout.split("──")[0]
    assert "nproc" in header and "sync" in header
    assert f"speed-up x{two['speedup']:.2f}" in res.stdout


def test_a_failed_job_is_a_failed_row_and_the_sweep_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    res = subprocess.run(
        [*warm.argv(), "sweep", RANKS, "--nproc", "2", "--workers", "0", "--batch-sizes", "4,8",
         "--device", "cpu", "--steps", "5", "--warmup", "1", "--no-live", "--json", "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT, check=False,
        env={**ENV, "STALLSCOPE_TEST_KILL_RANK": "1", "STALLSCOPE_TEST_KILL_AT": "1"},
    )  # fmt: skip
    assert res.returncode == 1, res.stderr  # no configuration completed
    assert "Traceback" not in res.stderr
    d = json.loads(res.stdout)
    assert [(r["config"], r["status"]) for r in d["rows"]] == [
        ("naive-b4-w0-x2", "failed"),
        ("naive-b8-w0-x2", "failed"),
    ]
    # the launcher's line: what it saw end (the agent may report rank 0, which lost its peer, before rank 1)
    assert all("the launcher stopped the other ranks" in r["error"] and "rank " in r["error"] for r in d["rows"])
    assert d["rows"][0]["throughput_samples_per_s"] is None and d["rows"][0]["speedup"] is None


def test_ctrl_c_during_a_job_ends_the_sweep_with_the_rows_so_far(tmp_path: Path) -> None:
    out = tmp_path / "sw"
    args = [sys.executable, "-m", "profiler", "sweep", RANKS, "--nproc", "2", "--workers", "0", "--batch-sizes",
            "8,16", "--device", "cpu", "--steps", "100000", "--warmup", "1", "--no-live",
            "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    job = out / "naive-b8-w0-x2"

    def stepping() -> bool:
        try:
            return all(len(load_run(job / f"rank-{r}").steps) > 2 for r in (0, 1))
        except Exception:  # noqa: BLE001 - not written yet
            return False

    try:
        assert wait_until(stepping, timeout=180, every=0.5)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the sweep, its agent and the ranks
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "stopped by SIGINT" in stderr
    d = json.loads((out / "sweep.json").read_text())
    assert d["status"] == "interrupted" and d["planned"] == 2
    assert [(r["config"], r["status"]) for r in d["rows"]] == [("naive-b8-w0-x2", "interrupted")]
    assert json.loads((job / "job.json").read_text())["status"] == "interrupted"
    assert all(load_run(job / f"rank-{r}").meta["status"] == "interrupted" for r in (0, 1))
    assert "naive-b8-w0-x2" in stdout  # the table of what ran
    assert not (out / "naive-b16-w0-x2").exists()


# -- bad input ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--nproc", "0,2"], ["--nproc", "0 in '0,2' is out of range", "1..64"]),
        (["--nproc", "1,,2"], ["--nproc", "empty item"]),
        (["--nproc", "two"], ["--nproc", "'two'", "not an integer"]),
        (["--nproc", "1,65"], ["--nproc", "65", "1..64"]),
        (["--nproc", "1,2", "--seconds", "5"], ["--nproc 1,2 with --seconds alone", "allowed --steps N"]),
    ],
)
def test_sweep_nproc_bad_input_is_one_line_and_exit_2(args: list[str], needles: list[str]) -> None:
    assert_one_line_error(stallscope("sweep", RANKS, "--device", "cpu", *args), *needles)


def test_tune_refuses_nproc_with_a_pointer_to_sweep() -> None:
    assert_one_line_error(stallscope("tune", RANKS, "--nproc", "2"), "--nproc 2", "stallscope sweep SCENARIO --nproc")
