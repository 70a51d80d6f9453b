"""Exact step figures for an unmodified script (``stallscope run -- CMD`` with its start-up module).

The truth: tests/data/meter_train.py times itself the way common training scripts do (an average meter for
data time and batch time around a ``for`` loop over its DataLoader) and writes every step's pair; stallscope's
steps for the same step indices must agree within 3%, at 0 and 2 workers and under torchrun. The start-up
module's own mechanics (site, knobs, overrides, chaining an existing sitecustomize, stepping aside, stopping
after N calls) are checked on small scripts run with the module on their PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, stallscope

from profiler.core.steps.batch_facts import batch_len as session_batch_len
from profiler.core.store import load_run
from profiler.zerocode.boot.stallscope_instrument import apply_overrides, batch_len
from profiler.zerocode.instrument import child_env

METER = str(ROOT / "tests" / "data" / "meter_train.py")
NODES = str(ROOT / "tests" / "data" / "nodes_train.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
# The bound: 2% of the script's own figure (issue #56; 3% before it). The script's data time also holds what runs
# after next() returns and before its next line: with workers, releasing the previous batch's shared-memory tensors as
# the loop rebinds x, y (measured: 20 us a step on a quiet host, 50-80 us with four busy processes beside it), and any
# preemption there, which stallscope counts in the step's compute (so the script's run-queue wait in its data window
# outside next() is netted out of its figure: a project CI run read -4.3% at torchrun rank 0, 1.7-6 ms a step, where
# quiet and beside four busy loops the gap is 0.12-0.28 ms a step). The items sleep so that the data wait dwarfs it:
# 10 ms at 0 workers (80 ms a step), 40 ms at 2 (55-111 ms a step beside four busy loops; at 10 ms the workers got
# ahead of a model slowed by the host, the wait fell to 3 ms and one 33 ms preemption made it -15%). Measured errors
# of the mean data wait: 0 workers -0.03% quiet, -0.02% beside two busy processes; 2 workers -0.08% to -0.17% beside
# four busy loops (3 runs); torchrun rank 0 -0.09% / -0.09%; on 2026-11-28, quiet: 0 workers -0.43% and -0.47%, 2
# workers -0.28%. Step time: within 0.01% in every run.
TOLERANCE = 0.02
# a data wait that is a sliver of the step is checked as its share of the step, which is what a report shows: rank 0
# of a torchrun job whose batches came ahead of rank 1's waited 2.6 ms a step, not 147, in a stress pass (its step,
# 167 ms, spent waiting for rank 1 in the gradients' all-reduce), and the script's meter held 0.35 ms a step more
# than next() (the lines between next() returning and its clock read): 12% of that wait, 0.2% of the step
WAIT_SHARE = 0.005


def run_meter(
    tmp_path: Path, *launcher: str, workers: int, steps: int = 40, sleep_ms: float = 10
) -> tuple[dict[str, Any], Path]:
    out = tmp_path / "run"
    truth = tmp_path / "truth-{rank}.json"
    res = stallscope(
        "run", "--json", "--no-live", "--out", str(out), "--", *launcher, METER, "--workers", str(workers),
        "--steps", str(steps), "--truth", str(truth), "--sleep-ms", str(sleep_ms),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout), out


def compare(out: Path, truth_file: Path) -> tuple[float, float, str, float]:
    """(relative error of the mean data wait, of the mean step time, the steps that differ most, the data wait's
    error as a share of the mean step) over the steps both measured. Where the script wrote its data window's
    run-queue wait (a third field), the truth is net of what of it fell outside ``next()``: time the script's
    thread waited for a CPU after the call returned and before its clock read, which the script counts as data
    and stallscope, rightly, in the step's compute."""
    truth = json.loads(truth_file.read_text())
    steps = [s for s in load_run(out).steps if not s.warmup]
    assert len(steps) >= 20
    rows = []
    for s in steps:
        their_runq = truth[s.step][2] if len(truth[s.step]) > 2 else None
        outside = 0.0
        if their_runq is not None and s.data_wait_runq_s is not None:
            outside = max(0.0, their_runq - s.data_wait_runq_s)
        rows.append((s.step, s.data_wait_s, truth[s.step][0] - outside, truth[s.step][0], outside))
    ours_wait = sum(r[1] for r in rows) / len(rows)
    their_wait = sum(r[2] for r in rows) / len(rows)
    ours_step = sum(s.t_end - s.t_start for s in steps) / len(steps)
    their_step = sum(truth[s.step][1] for s in steps) / len(steps)
    worst = sorted(rows, key=lambda r: -abs(r[2] - r[1]))[:3]
    detail = "; ".join(
        f"step {i}: ours {o * 1e3:.2f} ms, script {t * 1e3:.2f} ms less {q * 1e3:.2f} ms run-queue wait outside next()"
        for i, o, _net, t, q in worst
    )
    return ours_wait / their_wait - 1, ours_step / their_step - 1, detail, (ours_wait - their_wait) / their_step


def assert_matches(out: Path, truth_file: Path) -> None:
    """The run's mean data wait within TOLERANCE of the script's (or within WAIT_SHARE of its step, for a wait
    that is a sliver of it), and its mean step within TOLERANCE of the script's."""
    wait_err, step_err, worst, share_err = compare(out, truth_file)
    wait_ok = abs(wait_err) <= TOLERANCE or abs(share_err) <= WAIT_SHARE
    assert wait_ok and abs(step_err) <= TOLERANCE, (wait_err, share_err, step_err, worst)


@pytest.mark.parametrize("workers", [0, 2])
def test_step_figures_match_the_scripts_own_meters(tmp_path: Path, workers: int) -> None:
    # the items sleep long enough at 2 workers that the loader stays the bottleneck when the host slows the
    # model (beside busy processes its steps waited 60-160 ms for a CPU, the workers got ahead and a 3 ms wait
    # met one 33 ms preemption between next() and the meter's read)
    summary, out = run_meter(tmp_path, sys.executable, workers=workers, sleep_ms=10 if workers == 0 else 40)
    assert_matches(out, tmp_path / "truth-0.json")
    assert summary["mode"] == "auto-instrumented" and summary["steps"] >= 20
    assert summary["throughput_samples_per_s"] > 0 and summary["workers"] == workers
    assert summary["breakdown_ms_per_step"]["data_wait"] > 0
    assert summary["pipeline"] == "DataLoader" and summary["batch_size"] == 8
    meta = load_run(out).meta
    assert meta["loader_site"] == "meter_train.py:75" and meta["training_loader"]["args"]["num_workers"] == workers
    loader = summary["loader"]
    assert loader["site"] == "meter_train.py:75" and loader["args"]["batch_size"] == 8
    assert loader["args"]["sampler"] == "SequentialSampler" and loader["file"] == METER


def test_each_rank_of_a_torchrun_job_is_timed(tmp_path: Path) -> None:
    # 20 ms items: each rank's one worker makes a batch in 160 ms, so the wait (~150 ms a step) dwarfs what the
    # script's meter holds beyond next() (at 10 ms a fresh-clone CI run read -3.4%: 2 ms a step, 80 ms in all, of
    # preemption between next() returning and the meter's read, with two ranks, their workers, torchrun and two
    # other tests on two cores; quiet, the per-step gap is 0.06-0.14 ms)
    _summary, out = run_meter(tmp_path, *TORCHRUN, workers=1, steps=40, sleep_ms=20)
    # the run's steps are rank 0's; whichever rank's batches come later waits for its loader, the other for it
    assert_matches(out, tmp_path / "truth-0.json")
    meta = load_run(out).meta
    assert meta["instrumented_processes"] >= 2 and meta["training_loader"]["args"]["sampler"] == "DistributedSampler"


def test_a_torchdata_nodes_loader_is_timed_as_exactly(tmp_path: Path) -> None:
    out, truth = tmp_path / "run", tmp_path / "truth-0.json"
    res = stallscope(
        "run", "--json", "--no-live", "--out", str(out), "--", sys.executable, NODES, "--workers", "2",
        "--steps", "40", "--truth", str(truth),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert_matches(out, truth)
    summary = json.loads(res.stdout)
    assert summary["mode"] == "auto-instrumented" and summary["pipeline"] == "torchdata.nodes"
    args = summary["loader"]["args"]
    assert summary["loader"]["site"] == "nodes_train.py:42" and summary["loader"]["kind"] == "torchdata.nodes.Loader"
    assert args["batch_size"] == 8 and args["num_workers"] == 2 and args["method"] == "thread"
    assert args["nodes"] == "ParallelMapper <- Batcher <- ParallelMapper <- SamplerWrapper"  # Mapper: 0 workers


def test_the_report_names_the_loaders_line_and_no_instrument_falls_back_to_the_estimate(tmp_path: Path) -> None:
    summary, _out = run_meter(tmp_path, sys.executable, workers=0, steps=30)
    advice = [r for r in summary["recommendations"] if r["code"] == "RAISE_WORKERS"]
    assert advice and advice[0]["text"].startswith("meter_train.py:75: ")
    report = stallscope("report", str(_out))
    text = " ".join(report.stdout.replace("│", " ").split())  # the panel wraps long lines
    refused = stallscope("whatif", str(_out), "--workers", "2")  # nothing it could re-run to check
    assert refused.returncode == 2 and "needs a scenario it can re-run" in refused.stderr
    assert "DataLoader meter_train.py:75 DataLoader(num_workers=0, pin_memory=False," in text
    # the plain run's checks are of its mode and what it leaves out, not of its figures: 10 steps do
    res = stallscope(
        "run", "--json", "--no-live", "--no-instrument", "--pyspy-rate", "50", "--out", str(tmp_path / "plain"),
        "--", sys.executable, METER, "--steps", "10", "--truth", str(tmp_path / "t.json"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    plain = json.loads(res.stdout)
    assert plain["mode"] == "zero-code" and plain["steps"] == 0 and plain["throughput_samples_per_s"] is None
    assert not (tmp_path / "plain" / "instrument").exists()


def run_script(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` as a script under the start-up module, writing its records to tmp_path/rec."""
    (tmp_path / "rec").mkdir(exist_ok=True)
    script = tmp_path / "script.py"
    script.write_text(code)
    full = {**child_env(tmp_path / "rec"), **env}
    cmd = [sys.executable, str(script)]
    return subprocess.run(cmd, env=full, capture_output=True, text=True, timeout=120, check=False)


def records(tmp_path: Path) -> list[dict[str, Any]]:
    files = sorted((tmp_path / "rec").glob("p*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


LOOP = """\
import torch
from torch.utils.data import DataLoader, TensorDataset
data = TensorDataset(torch.arange(64.0).reshape(32, 2), torch.arange(32))
loader = DataLoader(data, batch_size=4, num_workers=0)
for epoch in range(2):
    for x, y in loader:
        pass
print("done")
"""


def test_the_module_records_site_knobs_and_every_call(tmp_path: Path) -> None:
    res = run_script(tmp_path, LOOP)
    assert res.returncode == 0 and res.stdout == "done\n", res.stderr
    recs = records(tmp_path)
    (lo,) = [r for r in recs if r["k"] == "loader"]
    assert lo["line"] == 4 and lo["file"].endswith("script.py") and lo["args"]["batch_size"] == 4
    assert lo["args"]["sampler"] == "SequentialSampler" and lo["args"]["dataset"] == "TensorDataset"
    kinds = [r["k"] for r in recs if r["k"] in ("iter", "next", "end")]
    assert kinds == (["iter"] + ["next"] * 8 + ["end"]) * 2
    assert all(r["n"] == 4 for r in recs if r["k"] == "next")


def test_overrides_change_the_loader_and_stop_after_ends_the_script_cleanly(tmp_path: Path) -> None:
    res = run_script(
        tmp_path, LOOP, STALLSCOPE_OVERRIDES='{"num_workers": 2, "persistent_workers": true}', STALLSCOPE_STOP="5"
    )
    assert res.returncode == 0 and "done" not in res.stdout, res.stderr  # stopped inside the first epoch
    recs = records(tmp_path)
    (lo,) = [r for r in recs if r["k"] == "loader"]
    assert lo["args"]["num_workers"] == 2 and lo["args"]["persistent_workers"] is True
    assert lo["applied"] == {"num_workers": 2, "persistent_workers": True}
    assert [r["k"] for r in recs].count("next") == 6 and recs[-1]["k"] == "stop"


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = 'yes'\n")
    env = child_env(tmp_path / "rec", base={**os.environ, "PYTHONPATH": str(theirs)})
    res = run_script(tmp_path, "import os\nprint(os.environ.get('THEIRS_RAN'))\n" + LOOP, PYTHONPATH=env["PYTHONPATH"])
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "yes", res.stderr
    assert any(r["k"] == "next" for r in records(tmp_path))


def test_a_torch_it_cannot_handle_makes_it_step_aside_in_one_line(tmp_path: Path) -> None:
    fake = tmp_path / "fake" / "torch" / "utils" / "data"
    fake.mkdir(parents=True)
    for d in (fake.parents[1], fake.parent, fake):
        (d / "__init__.py").write_text("")
    (fake / "dataloader.py").write_text("class DataLoader:\n    pass\n")  # no _BaseDataLoaderIter
    env = child_env(tmp_path / "rec")
    res = run_script(
        tmp_path, "import torch.utils.data.dataloader\nprint('ran')\n",
        PYTHONPATH=env["PYTHONPATH"] + os.pathsep + str(tmp_path / "fake"),
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout == "ran\n"
    (line,) = res.stderr.splitlines()
    assert "steps aside (torch.utils.data.dataloader has no _BaseDataLoaderIter)" in line
    assert [r["why"] for r in records(tmp_path) if r["k"] == "aside"]


def test_batch_len_and_overrides() -> None:
    import numpy as np
    import torch

    assert batch_len((torch.zeros(5, 3), torch.zeros(5))) == 5
    assert batch_len({"input_ids": np.zeros((7, 2))}) == 7
    assert batch_len([1, 2, 3]) == 3 and batch_len(object()) is None
    # the start-up module's copy counts as a Session does
    batches = [(torch.zeros(5, 3), 1), [{"x": torch.zeros(4)}], {}, [], ["a", "b"], [[1, 2], [3, 4]], torch.tensor(3.0)]
    assert [batch_len(b) for b in batches] == [session_batch_len(b) for b in batches]
    args: dict[str, Any] = {"num_workers": 4, "prefetch_factor": 4, "persistent_workers": True}
    applied = apply_overrides(args, {"num_workers": 0, "not_a_knob": 1})
    assert applied == {"num_workers": 0}  # unknown keys are not applied
    assert args == {"num_workers": 0, "prefetch_factor": None, "persistent_workers": False}


DALI_LOOP = """\
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator

@pipeline_def(batch_size=4, num_threads=1, device_id=None)
def pipe():
    return fn.random.uniform(range=[0.0, 1.0], shape=[8])

it = DALIGenericIterator(pipe(), ["x"], size=40)
for epoch in range(2):
    for batch in it:
        pass
print("done")
"""


def test_a_dali_iterator_is_timed_as_its_own_loader(tmp_path: Path) -> None:
    pytest.importorskip("nvidia.dali")
    res = run_script(tmp_path, DALI_LOOP)
    assert res.returncode == 0 and res.stdout == "done\n", res.stderr[-2000:]
    recs = records(tmp_path)
    (lo,) = [r for r in recs if r["k"] == "loader"]
    assert lo["kind"] == "DALIGenericIterator" and lo["line"] == 8
    assert lo["args"]["batch_size"] == 4 and lo["args"]["num_threads"] == 1
    mine = [r for r in recs if r.get("id") == lo["id"] and r["k"] in ("iter", "next", "end")]
    assert [r["k"] for r in mine].count("next") == 20 and all(r["n"] == 4 for r in mine if r["k"] == "next")
    assert [r["k"] for r in mine].count("end") == 2


def test_a_script_that_ends_normally_is_not_reported_lost(tmp_path: Path) -> None:
    # issue #57: at the end of `run -- python main.py` stallscope printed, for each source that followed the script,
    # "source host lost at 37.8 s: process 1845 exited; sampling goes on without it": the script had just finished
    script = tmp_path / "train.py"
    script.write_text(
        "import time\nfrom torch.utils.data import DataLoader\n"
        "for _ in DataLoader(list(range(240)), batch_size=4):\n    time.sleep(0.01)\n"
    )
    out = tmp_path / "r"
    res = stallscope("run", "--no-live", "--out", str(out), "--", sys.executable, str(script))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "lost" not in res.stderr and "goes on without it" not in res.stderr, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"] > 0
    assert not any(v.startswith("lost") for v in summary["sampler"]["sources"].values()), summary["sampler"]
