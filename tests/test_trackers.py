"""``stallscope report RUN --to``: the run's figures written through each real tracker library and read back with
that library's own reader (no mock on this path), against the store's own figures and the injected sleeps.

The run: a Session loop whose loader sleeps ``WAIT_S`` in every ``next()`` (each whole call timed into a Truth),
whose copy and compute sleep too, with a known batch size. The series' mean equals the Summary's (each point is one
step here), the run figures are the Summary's, and every point's data wait holds at least its injected sleep.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import wandb_file
from conftest import ROOT, Truth, sleep_loader, wait_until

from profiler import Session
from profiler.analysis.summary import Summary
from profiler.cli import main
from profiler.core.store import load_run

WAIT_S, H2D_S, COMPUTE_S, STEPS, WARMUP, BATCH = 0.004, 0.001, 0.002, 10, 2, 4


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Summary, Truth]:
    out = tmp_path_factory.mktemp("trackers") / "run"
    truth = Truth()
    # the default sampler process: a sampler thread in this process held the GIL for ms at a time (ci26: a mean wait
    # 0.43 ms over the loader's own next(), where runs alone read 0.003-0.011 ms)
    with Session(out, warmup=WARMUP, meta={"batch_size": BATCH}) as s:
        for _ in s.wrap(sleep_loader(STEPS + WARMUP, WAIT_S, BATCH, truth)):
            with s.phase("h2d"):
                truth.sleep("h2d", H2D_S)
            with s.phase("compute"):
                truth.sleep("compute", COMPUTE_S)
    summary = s.summary()
    assert summary is not None and summary.steps == STEPS
    return out, summary, truth


def check_series(series: dict[str, list[tuple[int, float]]], summary: Summary, truth: Truth, out: Path) -> None:
    """The step series against the Summary (within float32 rounding) and the injected sleeps (less the run-queue
    wait each measured wait had outside the truth's own window: a preemption beside busy processes is the
    measurement's time, not the loader's, as in tests/test_session_ground_truth.py)."""
    waits = [v for _, v in series["stall/data_wait_ms"]]
    assert len(waits) == STEPS
    assert [s for s, _ in series["stall/step_ms"]] == list(range(WARMUP, WARMUP + STEPS))
    assert statistics.fmean(waits) == pytest.approx(summary.breakdown_ms_per_step.data_wait, rel=1e-5)
    steps_ms = [v for _, v in series["stall/step_ms"]]
    assert statistics.fmean(steps_ms) == pytest.approx(summary.step_time_ms.mean, rel=1e-5)
    # each step's recorded wait holds the loader's injected sleep (the whole next(), as timed by the truth)
    assert min(waits) >= WAIT_S * 1e3 * 0.999
    outside = truth.outside_ms("data_wait", [st.data_wait_runq_s for st in load_run(out).steps], skip=WARMUP)
    assert statistics.fmean(waits) - outside == pytest.approx(truth.mean_ms("data_wait", skip=WARMUP), abs=0.3)
    tput = [v for _, v in series["stall/throughput_samples_per_s"]]
    assert tput == pytest.approx([BATCH / (ms / 1e3) for ms in steps_ms], rel=1e-5)


def check_run_figures(figures: dict[str, float], summary: Summary) -> None:
    assert figures["stall/run/steps"] == STEPS
    assert figures["stall/run/step_ms"] == pytest.approx(summary.step_time_ms.mean, rel=1e-5)
    assert figures["stall/run/data_wait_ms"] == pytest.approx(summary.breakdown_ms_per_step.data_wait, rel=1e-5)
    tput = summary.throughput_samples_per_s
    assert figures["stall/run/throughput_samples_per_s"] == pytest.approx(tput, rel=1e-5)
    # data wait is most of each step: the verdict's rule says input-bound
    assert figures["stall/run/input_bound"] == 1.0
    assert "stall/run/gpu_util_pct" not in figures  # a CPU run has no GPU utilisation: left out, never 0


def test_tensorboard_event_file_read_back(run: tuple[Path, Summary, Truth], tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, summary, truth = run
    assert main(["report", str(out), "--to", f"tensorboard:{tmp_path / 'tb'}"]) == 0
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    series = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    check_series(series, summary, truth, out)
    check_run_figures({k: v[-1][1] for k, v in series.items() if k.startswith("stall/run/")}, summary)
    assert not any(k.startswith(("system", "stall/held/")) for k in series)  # no window held a step here
    assert "stall/verdict/text_summary" in acc.Tags()["tensors"]


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A SQLite tracking store (made once: its migrations take seconds)."""
    from mlflow.tracking import MlflowClient

    d = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{d / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("exported", artifact_location=(d / "artifacts").as_uri())
    return uri


def test_mlflow_sqlite_store_read_back(
    run: tuple[Path, Summary, Truth], mlflow_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    out, summary, truth = run
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "exported")
    assert main(["report", str(out), "--to", f"mlflow:{mlflow_uri}"]) == 0
    client = MlflowClient(tracking_uri=mlflow_uri)
    exp = client.get_experiment_by_name("exported")
    (made,) = client.search_runs([exp.experiment_id])
    assert made.info.status == "FINISHED"  # made for the export (no run was active), and ended
    run_id = made.info.run_id
    names = ["stall/step_ms", "stall/data_wait_ms", "stall/throughput_samples_per_s"]
    series = {n: [(m.step, m.value) for m in client.get_metric_history(run_id, n)] for n in names}
    check_series(series, summary, truth, out)
    check_run_figures(made.data.metrics, summary)
    arts = {a.path for a in client.list_artifacts(run_id, "stallscope")}
    assert {"stallscope/stallscope-report.html", "stallscope/stall_verdict.md"} <= arts


def test_wandb_offline_run_read_back(
    run: tuple[Path, Summary, Truth], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offline run (``WANDB_MODE=offline``) read back from its run file. wandb 0.31 writes no
    ``files/wandb-summary.json`` offline and has no reader of its run file in Python (its internal datastore
    reader was removed with the Go core): tests/wandb_file.py reads the file's records with wandb's own protobuf
    schema, the series (each log() call's row) and the summary."""
    out, summary, truth = run
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    import wandb

    wandb.teardown()  # a wandb set up earlier in this process keeps its WANDB_DIR
    try:
        assert main(["report", str(out), "--to", "wandb"]) == 0
    finally:
        wandb.teardown()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's core process may still be writing the file when finish() returns (seen: 7 bytes, its header alone)
    assert wait_until(lambda: "stall/verdict" in wandb_file.summary(run_file), timeout=30)
    rows = wandb_file.history(run_file)
    series = {
        name: [(int(r["stall/step"]), float(r[name])) for r in rows if name in r]
        for name in ("stall/step_ms", "stall/data_wait_ms", "stall/throughput_samples_per_s")
    }
    check_series(series, summary, truth, out)
    assert [r["_step"] for r in rows] == list(range(len(rows)))  # logged without step=: W&B's own count
    got = wandb_file.summary(run_file)
    check_run_figures({k: v for k, v in got.items() if k.startswith("stall/run/")}, summary)
    assert got["stall/verdict"].startswith(f"## stallscope: {summary.verdict}")


KILLED = """
import os, signal, sys, time
from profiler import Session
from profiler.core.store import read_head
out = sys.argv[1]
with Session(out, sample_hz=20, meta={"batch_size": 4}) as s:
    for _ in s.wrap(range(20)):
        time.sleep(0.004)
    deadline = time.monotonic() + 20
    while read_head(out)[1] < 20 and time.monotonic() < deadline:  # every step stored, then the kill
        time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_run_exports_from_its_store(tmp_path: Path) -> None:
    """A Session killed (SIGKILL) in its block: the sampler process closed the store ``interrupted``; its
    measured steps export all the same."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from profiler.core.store import read_head

    out = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(out)], cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL
    assert wait_until(lambda: read_head(out)[0].get("status") == "interrupted")
    assert main(["report", str(out), "--to", f"tensorboard:{tmp_path / 'tb'}"]) == 0
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    waits = [e.value for e in acc.Scalars("stall/step_ms")]
    assert len(waits) == 20 and min(waits) >= 4.0 * 0.999  # each step slept 4 ms
    assert acc.Scalars("stall/run/steps")[0].value == 20


@pytest.mark.parametrize(
    ("target", "said"),
    [
        ("neptune", "'neptune': not a tracker: allowed tensorboard:DIR, mlflow, mlflow:TRACKING_URI or wandb"),
        ("tensorboard", "tensorboard needs its log directory"),
        ("wandb:x", "wandb takes no argument"),
    ],
)
def test_a_bad_target_is_one_line_exit_2(
    run: tuple[Path, Summary, Truth], target: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run[0]), "--to", target]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err


def test_a_missing_package_names_its_extra(
    run: tuple[Path, Summary, Truth], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    assert main(["report", str(run[0]), "--to", "wandb"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "stallscope: error: wandb needs the wandb package: pip install 'stallscope[wandb]'"


def test_an_unwritable_log_dir_is_one_line_exit_2(
    run: tuple[Path, Summary, Truth], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert main(["report", str(run[0]), "--to", f"tensorboard:{blocked / 'tb'}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"stallscope: error: --to tensorboard:{blocked / 'tb'}: cannot open it:") and "\n" not in err
    assert os.path.isfile(blocked)


def test_a_job_exports_each_rank_and_the_slowest(tmp_path: Path) -> None:
    """Two ranks (rank 1's compute 30 ms slower each step): each rank's series under stall/rankR/, and stall/ the
    slowest rank's at each step, as detectron2 takes the ranks' max."""
    from jobfake import RankPlan, job_json, run_ranks
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from profiler.analysis import summarize
    from profiler.core.store import load_run

    job = tmp_path / "job"
    run_ranks(job, {0: RankPlan(compute_s=0.002), 1: RankPlan(compute_s=0.032)}, 2, "job-a")
    job_json(job)
    assert main(["report", str(job), "--to", f"tensorboard:{tmp_path / 'tb'}"]) == 0
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for r in (0, 1):
        summary = summarize(load_run(job / f"rank-{r}"))
        ms = [v for _, v in got[f"stall/rank{r}/step_ms"]]
        assert statistics.fmean(ms) == pytest.approx(summary.step_time_ms.mean, rel=1e-5)
        assert got[f"stall/rank{r}/run/steps"][-1][1] == summary.steps
    slowest = dict(got["stall/step_ms"])
    for (step, v0), (_, v1) in zip(got["stall/rank0/step_ms"], got["stall/rank1/step_ms"], strict=True):
        assert slowest[step] == max(v0, v1)
    assert got["stall/run/slowest_rank"][-1][1] == 1


def test_the_fold_keeps_held_and_warm_up_steps_apart() -> None:
    """Pure: steps handed over again are taken once; warm-up steps are left out; a step a kernel window overlaps
    goes under stall/held/, never into the series; a long series' points each cover several steps."""
    from profiler.core.rows import KernelWindow, PhaseRow, StepRow
    from profiler.trackers.analysis import LiveFold, series

    def row(i: int, wait: float, warmup: bool = False) -> tuple[StepRow, list[PhaseRow]]:
        t = i * 0.1
        return StepRow(i, t, t + 0.1, wait, 4, warmup), [PhaseRow(i, "compute", 0, t + wait, t + 0.1)]

    fold = LiveFold()
    fold.add_windows([KernelWindow(0, 0.45, 0.55, 0.01, [])])  # overlaps step 4 (0.4-0.5) and step 5 (0.5-0.6)
    rows = [row(0, 0.09, warmup=True), *[row(i, 0.02 * i) for i in range(1, 8)]]
    fold.add(rows[:4], {})
    fold.add(rows, {})  # handed over again, with more: each step once
    got = {p.name: p for p in fold.take()}
    assert got["stall/data_wait_ms"].value == pytest.approx(1e3 * (0.02 + 0.04 + 0.06 + 0.12 + 0.14) / 5)
    assert got["stall/held/data_wait_ms"].value == pytest.approx(1e3 * (0.08 + 0.10) / 2)
    assert (got["stall/data_wait_ms"].step, got["stall/held/data_wait_ms"].step) == (7, 5)  # their last steps
    assert got["stall/throughput_samples_per_s"].value == pytest.approx(4 / 0.1)
    assert fold.take() == []  # nothing new since
    assert fold.run_figures()["stall/run/steps"] == 5
    long = series([r for r, _ in rows[1:]], {r.step: p for r, p in rows}, max_points=3)
    assert [p.step for p in long if p.name == "stall/step_ms"] == [3, 6, 7]  # 7 steps in points of 3, 3, 1
