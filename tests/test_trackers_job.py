"""Live tracker logging of a multi-rank job (``run SCENARIO --nproc N --log-to TARGET``): one logger in the
launching process follows the rank stores, logging each rank's point under ``stall/rankR/`` and the slowest
rank's under ``stall/``; at the close the job's figures as ``report JOB --to`` writes them. Read back with each
tracker's own reader (tensorboard's EventAccumulator, MlflowClient on a SQLite store, the W&B run file), never a
mock.

Truth: each point's values are the means of the steps it covers, read from the rank's own store (the same rows),
and the slowest rank's are the point of the rank whose step time is the longest there; the close's figures are
``read_export``'s (what ``report JOB --to`` writes) on the same stores.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
import wandb_file
import warm
from conftest import ROOT, stallscope, wait_until

from profiler.cli import main
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.store import load_run
from profiler.trackers.analysis import JobFold
from profiler.trackers.base import parse_targets
from profiler.trackers.export import read_export

RANKS = str(ROOT / "tests" / "data" / "scenarios" / "ranks.py")
Series = dict[str, list[tuple[int, float]]]


def _row(rank_step: int, t: float, ms: float, wait_ms: float, warmup: bool = False) -> tuple[StepRow, list[PhaseRow]]:
    end = t + ms / 1e3
    return StepRow(rank_step, t, end, wait_ms / 1e3, 4, warmup), [
        PhaseRow(rank_step, "compute", 0, t + wait_ms / 1e3, end)
    ]


def test_the_job_fold_aligns_the_ranks_and_takes_the_slowest() -> None:
    """Pure: a rank ahead is folded only up to the step every rank has handed over, so one take's points cover the
    same steps on every rank; stall/ holds the points of the rank whose steps took longest over them; the close
    takes the rest; a rank's readings go with the steps they were taken beside."""
    fold = JobFold(2)
    fast = [_row(i, i * 0.01, 10.0, 1.0, warmup=i == 0) for i in range(8)]
    slow = [_row(i, i * 0.03, 30.0, 2.0, warmup=i == 0) for i in range(8)]
    fold.add(0, fast[:6], [], [], {})
    assert fold.take() == []  # rank 1 has handed nothing yet: no point, no rank's steps folded
    fold.add(1, slow[:4], [], [], {})
    fold.add(0, fast[:7], [], [], {})  # handed over again, with one more: each step once
    got = {p.name: p for p in fold.take()}
    assert {got[f"stall/rank{r}/step_ms"].step for r in (0, 1)} == {3}  # steps 1-3 on both (step 0: warm-up)
    assert got["stall/rank0/step_ms"].value == pytest.approx(10.0)
    assert got["stall/rank1/data_wait_ms"].value == pytest.approx(2.0)
    assert (got["stall/step_ms"].value, got["stall/data_wait_ms"].value) == pytest.approx((30.0, 2.0))  # rank 1's
    fold.add(1, slow, [], [], {})
    fold.add(0, fast, [], [], {})
    got = {p.name: p for p in fold.take()}
    assert got["stall/rank0/step_ms"].step == got["stall/rank1/step_ms"].step == 7
    assert fold.take() == [] and fold.take(final=True) == []
    cuda = {"device": {"kind": "cuda"}}
    fold = JobFold(1)  # a CUDA rank's utilisation readings: those taken up to the folded steps' end only
    fold.add(0, [_row(i, i * 0.1, 100.0, 1.0) for i in range(3)], [(0.05, {"gpu0.util_pct": 40.0})], [], cuda)
    fold.add(0, [], [(0.25, {"gpu0.util_pct": 60.0}), (0.35, {"gpu0.util_pct": 99.0})], [], cuda)
    assert {p.name: p.value for p in fold.take()}["stall/gpu_util_pct"] == pytest.approx(50.0)
    fold.add(0, [_row(3, 0.3, 100.0, 1.0)], [], [], cuda)
    assert {p.name: p.value for p in fold.take()}["stall/gpu_util_pct"] == pytest.approx(99.0)


def store_steps(rank_dir: Path) -> tuple[list[StepRow], dict[int, list[PhaseRow]]]:
    rec = load_run(rank_dir)
    phases: dict[int, list[PhaseRow]] = {}
    for p in rec.phases:
        phases.setdefault(p.step, []).append(p)
    return [s for s in rec.steps if not s.warmup], phases


def check_rank_points(got: Series, rank: int, rank_dir: Path) -> None:
    """Each of the rank's points is the mean over the steps since its previous point, from the rank's own store;
    together they cover every measured step once."""
    steps, phases = store_steps(rank_dir)
    at = [s for s, _ in got[f"stall/rank{rank}/step_ms"]]
    assert at == sorted(set(at)) and at[-1] == steps[-1].step
    lo = -1
    for (s, ms), (_, wait), (_, compute) in zip(
        got[f"stall/rank{rank}/step_ms"],
        got[f"stall/rank{rank}/data_wait_ms"],
        got[f"stall/rank{rank}/compute_ms"],
        strict=True,
    ):
        covered = [row for row in steps if lo < row.step <= s]
        assert covered, (rank, lo, s)
        assert ms == pytest.approx(statistics.fmean((r.t_end - r.t_start) * 1e3 for r in covered), rel=1e-5)
        assert wait == pytest.approx(statistics.fmean(r.data_wait_s * 1e3 for r in covered), rel=1e-5)
        took = [
            sum(p.t_end - p.t_start for p in phases[r.step] if p.depth == 0 and p.name == "compute") for r in covered
        ]
        assert compute == pytest.approx(statistics.fmean(took) * 1e3, rel=1e-5)
        lo = s


def check_slowest(got: Series, ranks: Sequence[int]) -> None:
    """At each point, stall/ holds the point of the rank whose step time is the longest there (every series)."""
    by_rank = {r: {name: dict(got[f"stall/rank{r}/{name}"]) for name in ("step_ms", "data_wait_ms")} for r in ranks}
    assert [s for s, _ in got["stall/step_ms"]] == [s for s, _ in got[f"stall/rank{ranks[0]}/step_ms"]]
    for (s, ms), (_, wait) in zip(got["stall/step_ms"], got["stall/data_wait_ms"], strict=True):
        worst = max(ranks, key=lambda r: by_rank[r]["step_ms"][s])
        assert ms == by_rank[worst]["step_ms"][s] and wait == by_rank[worst]["data_wait_ms"][s]


def tensorboard_scalars(tb: Path) -> tuple[Series, dict[str, list[float]]]:
    """Each tag's (step, value) points, and each tag's events' wall times."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tb), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in tags}
    return got, {tag: [e.wall_time for e in acc.Scalars(tag)] for tag in tags}


def run_figures(got: Mapping[str, Sequence[tuple[int, float]]]) -> dict[str, float]:
    return {tag: pts[-1][1] for tag, pts in got.items() if "/run/" in tag}


def test_run_nproc_log_to_tensorboard_and_mlflow(tmp_path: Path) -> None:
    """A real two-rank job (rank 1 loads 5 ms more an item) logging to TensorBoard and an MLflow SQLite store at
    once: points while the job runs, each rank's from its own steps, stall/ the slowest's; at the close the run
    figures ``report JOB --to`` writes, the same numbers; --json's stdout stays the summary alone."""
    from mlflow.tracking import MlflowClient

    tb, job, uri = tmp_path / "tb", tmp_path / "job", f"sqlite:///{tmp_path / 'mlflow.db'}"
    MlflowClient(tracking_uri=uri).create_experiment("jobs", artifact_location=(tmp_path / "art").as_uri())
    args = [*warm.argv(), "run", RANKS, "--nproc", "2", "--device", "cpu", "--out", str(job), "--steps", "30"]
    args += ["--warmup", "3", "--no-live", "--json", "--log-to", f"tensorboard:{tb}", "--log-to", f"mlflow:{uri}"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STALLSCOPE_TEST_STRAGGLER": "1", "MLFLOW_EXPERIMENT_NAME": "jobs"}
    env.pop("MLFLOW_RUN_ID", None)
    res = subprocess.run(
        [*args, "--log-every", "0.2"], capture_output=True, text=True, check=False, timeout=300, cwd=ROOT, env=env
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)  # the summary JSON alone: the trackers wrote nothing to stdout
    assert summary["steps"] == 30 and [r["rank"] for r in summary["ranks"]] == [0, 1]
    got, walls = tensorboard_scalars(tb)
    ended = json.loads((job / "job.json").read_text())["ended_at"]
    assert min(walls["stall/rank1/step_ms"]) < ended, "no point was logged while the job ran"
    for r in (0, 1):
        check_rank_points(got, r, job / f"rank-{r}")
    check_slowest(got, (0, 1))
    # the close: the figures report JOB --to writes, the same numbers
    assert main(["report", str(job), "--to", f"tensorboard:{tmp_path / 'tb2'}"]) == 0
    reported = run_figures(tensorboard_scalars(tmp_path / "tb2")[0])
    assert run_figures(got) == reported and reported["stall/rank1/run/steps"] == 30
    expected = read_export(job).records.summary
    assert set(expected) == set(reported)
    client = MlflowClient(tracking_uri=uri)
    (made,) = client.search_runs([client.get_experiment_by_name("jobs").experiment_id])
    assert made.info.status == "FINISHED" and made.info.run_name == job.name
    assert {k: v for k, v in made.data.metrics.items() if "/run/" in k} == pytest.approx(expected, rel=1e-12)
    history = client.get_metric_history(made.info.run_id, "stall/rank1/step_ms")
    assert [m.step for m in history] == [s for s, _ in got["stall/rank1/step_ms"]]
    assert [m.value for m in history] == pytest.approx([v for _, v in got["stall/rank1/step_ms"]], rel=1e-6)
    assert min(m.timestamp for m in history) / 1e3 < ended  # logged while the job ran, here too
    arts = {a.path for a in client.list_artifacts(made.info.run_id, "stallscope")}
    assert {"stallscope/stallscope-report.html", "stallscope/stall_verdict.md"} <= arts


RANK_LOOP = """
import sys
from pathlib import Path
from conftest import Truth, sleep_loader
from profiler import Session

out, rank, compute_s, steps, job_id = (
    Path(sys.argv[1]),
    int(sys.argv[2]),
    float(sys.argv[3]),
    int(sys.argv[4]),
    sys.argv[5],
)
meta = {"scenario": "fake", "rank": rank, "world_size": 2, "local_rank": rank, "node_rank": 0, "job_id": job_id}
truth = Truth()
with Session(out, sample_hz=5, device="cpu", warmup=2, sources=[], meta={"batch_size": 8, **meta}) as s:
    for _ in s.wrap(sleep_loader(steps + 2, 0.002, 8, truth)):
        with s.phase("compute"):
            truth.sleep("compute", compute_s)
"""


def rank_process(out: Path, rank: int, compute_s: float, steps: int, job_id: str) -> subprocess.Popen[bytes]:
    """A rank of its own process, as a launch makes them: the logger's work in the launching process (a tracker's
    open, its imports) cannot hold a rank's steps up, as it would a rank thread's through the GIL."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    args = [str(out), str(rank), str(compute_s), str(steps), job_id]
    return subprocess.Popen([sys.executable, "-c", RANK_LOOP, *args], env=env)


def test_a_job_logged_to_wandb_from_the_launching_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two rank processes (rank 1's compute 30 ms longer a step, rank 0 free to run ahead) followed by the launching
    process's logger into an offline W&B run it makes: the ranks' rows hold the same steps, stall/ is rank 1's,
    and the summary is read_export's (tests/wandb_file.py reads the run file: wandb has no reader of its own)."""
    import wandb

    from profiler.trackers.joblive import follow_job

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    wandb.teardown()  # a wandb set up earlier in this process keeps its WANDB_DIR
    job = tmp_path / "job"
    job.mkdir()
    (job / "job.json").write_text(json.dumps({"job_id": "job-w", "nproc_per_node": 2, "nnodes": 1, "node_rank": 0}))
    try:
        with follow_job(job, parse_targets("wandb"), ranks=2, every_s=0.3):
            ranks = [rank_process(job / f"rank-{r}", r, 0.002 + 0.03 * r, 60, "job-w") for r in (0, 1)]
            assert [p.wait(timeout=60) for p in ranks] == [0, 0]
    finally:
        wandb.teardown()
    (run_file,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert wait_until(lambda: "stall/verdict" in wandb_file.summary(run_file), timeout=30)
    rows = wandb_file.history(run_file)
    got: Series = {}
    for row in rows:
        for k, v in row.items():
            if k.startswith("stall/") and k != "stall/step":
                got.setdefault(k, []).append((int(row["stall/step"]), float(v)))
    assert len(got["stall/step_ms"]) >= 2
    for r in (0, 1):
        check_rank_points(got, r, job / f"rank-{r}")
    check_slowest(got, (0, 1))
    assert got["stall/step_ms"] == got["stall/rank1/step_ms"]  # rank 1 is the slowest at every point
    expected = read_export(job).records.summary
    figures = {k: v for k, v in wandb_file.summary(run_file).items() if "/run/" in k}
    assert figures == pytest.approx(expected, rel=1e-12) and figures["stall/run/slowest_rank"] == 1


def test_log_to_on_several_nodes_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = stallscope(
        "run", RANKS, "--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "--out",
        str(tmp_path / "job"), "--log-to", f"tensorboard:{tmp_path / 'tb'}",
    )  # fmt: skip
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("stallscope: error: --log-to: not with --nnodes 2: each node sees only its own ranks")
    assert not (tmp_path / "job").exists() and not (tmp_path / "tb").exists()
