"""Ray Data's own stats in the report, ``--ray-address``, and the ``ray`` pipeline's faults.

The view's tests read ``ray_stats`` records made by hand (no Ray): Ray's blocked time per batch beside the loop's
data wait over the same batches, in summary.json, the text report and the HTML. The faults run on a real local Ray
instance, started once for the module (one xdist worker runs the module, as tests/test_pipelines_ray.py): a
cluster with no CPU free is one line in seconds, a Ray worker killed mid-run is said and survived; and a run that
starts its own instance, whose worker is killed, keeps everything it recorded and leaves no Ray process behind.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stallscope, wait_until
from rich.console import Console

from profiler.analysis import summarize
from profiler.analysis.ray_view import ray_view
from profiler.analysis.timeline import build_timeline
from profiler.core.store import RunRecord
from profiler.render.html import render_html
from profiler.render.report import render_report
from tests.test_summary_contract import known

pytestmark = pytest.mark.xdist_group("ray")

BATCHES = 11  # known(): 11 steps of 30 ms data wait, the first a warm-up step


def stats(blocked_s: float, first_s: float = 0.5, batches: int = BATCHES, **extra: Any) -> dict[str, Any]:
    """A ``ray_stats`` record as the pipeline stores it (pipelines.ray_stats.read_stats)."""
    op = {"operator": "Project->MapBatches(LoadItems)", "wall_s": 2.0, "cpu_s": 0.88, "rows": 88.0, "tasks": 11}
    return {
        "source": "Ray Data's own stats",
        "operators": [
            {"operator": "FromNumpy", "wall_s": 0.01, "cpu_s": 0.01, "rows": 88.0, "tasks": 11},
            {**op, "backpressure_s": 1.25, "output_backpressure_s": 0.5},
        ],
        "user_thread_blocked_s": blocked_s,
        "first_batch_s": first_s,
        "user_code_s": 0.7,
        "total_s": 1.5,
        "blocked_on_production_s": blocked_s - 0.1,
        "batches": batches,
        **extra,
    }


def test_view_puts_rays_blocked_time_per_batch_beside_the_loops_wait_over_the_same_batches() -> None:
    waits = [9.0] + [0.030] * 4 + [0.040] * 6  # a first step of Ray's start, then the epoch's steady state
    view = ray_view({"ray_stats": stats(0.5 + 0.044 * 10)}, data_wait_ms=37.5, steps=8, step_waits_s=waits)
    assert view is not None
    assert view.blocked_ms_per_batch == pytest.approx(44.0)  # Ray's: (blocked - first batch) / 10
    assert view.loop_epoch_wait_ms == pytest.approx(36.0)  # the last 11 steps but their first: 4x30 + 6x40 / 10
    assert view.apart == pytest.approx(44.0 / 36.0 - 1)
    assert view.loop_data_wait_ms == 37.5 and view.steps == 8  # the measured steps' figure, kept apart
    (load,) = [op for op in view.operators if "LoadItems" in op.name]
    assert load.cpu_ms_per_row == pytest.approx(10.0) and load.backpressure_s == 1.25
    assert view.headline.startswith("Ray's timers: the training thread blocked 44.0 ms a batch")
    assert "36.0 ms of data wait a step over the same batches (+22%, apart" in view.headline
    assert "most CPU (Ray's): Project->MapBatches(LoadItems), 10.00 ms a row" in view.headline
    # fewer recorded steps than Ray's batches: no same-batch figure, and no comparison made up
    short = ray_view({"ray_stats": stats(0.94)}, data_wait_ms=30.0, steps=5, step_waits_s=[0.03] * 5)
    assert short is not None and short.apart != short.apart and "n/a of data wait" in short.headline
    assert ray_view({"workers": 2}, data_wait_ms=30.0, steps=5) is None  # not a ray run: no view
    lost = ray_view({"ray_stats": stats(0.8), "ray_workers_lost": 1}, data_wait_ms=30.0, steps=10)
    assert lost is not None and lost.headline.startswith("Ray lost 1 worker process(es) mid-run (killed or crashed)")


def _ray_record(blocked_s: float) -> RunRecord:
    return known(pipeline="ray", loader={"pipeline": "ray", "ray_stats": stats(blocked_s)})


def test_summary_json_text_and_html_carry_rays_view_labelled_as_rays() -> None:
    rec = _ray_record(0.5 + 0.030 * 10)  # Ray's blocked time agrees with the loop's 30 ms a step
    s = summarize(rec)
    ray = s.to_dict()["ray"]
    assert ray["blocked_ms_per_batch"] == pytest.approx(30.0) and ray["loop_epoch_wait_ms"] == pytest.approx(30.0)
    assert abs(ray["apart"]) < 1e-9 and ray["loop_data_wait_ms"] == pytest.approx(30.0) and ray["steps"] == 10
    assert ray["source"].startswith("Ray's own") and ray["operators"][1]["backpressure_s"] == 1.25
    assert ray["operators"][0]["backpressure_s"] is None  # Ray gave none for the input: null, not 0
    out = io.StringIO()
    render_report(s, Console(file=out, width=200, color_system=None))
    text = " ".join(out.getvalue().replace("│", " ").split())  # the panel's wrapping undone
    assert "Ray Data's own stats, per operator (Ray's figures, not stallscope's clock)" in text
    assert "Project->MapBatches(LoadItems)" in text and "1.25 / 0.50" in text
    assert "Ray's timers: the training thread blocked 30.0 ms a batch" in text and "(+0%)" in text
    assert "MEASURED by stallscope: 30.0 ms of data wait a step over the same batches" in text
    html = render_html(s, build_timeline(rec))
    assert '<section id="ray">' in html and 'data-operator="FromNumpy"' in html
    assert "Ray&#x27;s timers: the training thread blocked 30.0 ms" in html
    assert summarize(known()).to_dict()["ray"] is None  # a run of another pipeline: no section, a null key


def test_a_view_that_disagrees_says_so() -> None:
    s = summarize(_ray_record(0.5 + 0.045 * 10))  # Ray's 45 ms against the loop's 30: 50% apart
    assert s.ray is not None and s.ray.apart == pytest.approx(0.5)
    assert "(+50%, apart: see the method)" in s.ray.headline


def test_a_ray_scripts_own_timers_under_run_dash_dash_reach_the_view() -> None:
    from profiler.zerocode.instrument import Process

    proc = Process(pid=7)
    timers = {"source": "Ray Data's own timers", "user_code_s": 0.2, "blocked_on_production_s": 0.1}
    proc.take({"k": "ray_stats", "id": 0, **timers, "user_thread_blocked_s": 9.0, "first_batch_s": 1.0, "batches": 3})
    proc.take({"k": "ray_stats", "id": 0, **timers, "user_thread_blocked_s": 0.8, "first_batch_s": 0.5, "batches": 11})
    assert proc.ray_stats[0]["batches"] == 11  # the latest epoch's, as for the pipeline
    loader = {"site": "train.py:17", "kind": "ray.data.DataIterator", "ray_stats": proc.ray_stats[0]}
    s = summarize(known(training_loader=loader))
    assert s.ray is not None and s.ray.operators == () and s.ray.blocked_ms_per_batch == pytest.approx(30.0)
    assert s.ray.loop_epoch_wait_ms == pytest.approx(30.0) and "(+0%)" in s.ray.headline


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["run", "--ray-address", "head.example"], ["--ray-address", "'head.example' is not a Ray address"]),
        (["sweep", "--ray-address", "10.0.0.5:99999"], ["--ray-address", "port 99999 is out of range"]),
        (["tune", "--ray-address", "http://x:1"], ["--ray-address", "ray://host:port or auto"]),
    ],
)
def test_a_bad_ray_address_is_one_line_and_exit_2(args: list[str], needles: list[str]) -> None:
    res = stallscope(*args)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert all(n in lines[0] for n in needles), lines[0]


def test_an_unreachable_ray_address_is_one_line_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = stallscope("run", "mlp-mnist", "--pipeline", "ray", "--ray-address", "127.0.0.1:1", "--device", "cpu",
                     "--out", str(out))  # fmt: skip
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert "cannot reach the Ray instance at --ray-address=127.0.0.1:1" in lines[0] and not out.exists()


def test_the_flag_overrides_ray_address(monkeypatch: pytest.MonkeyPatch) -> None:
    from profiler.cli.rayaddress import apply_ray_address

    monkeypatch.setenv("RAY_ADDRESS", "10.9.9.9:6379")
    with socket.socket() as listener:  # something that takes the connection the flag's check makes
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        apply_ray_address(argparse.Namespace(ray_address=address))
    assert os.environ["RAY_ADDRESS"] == address
    apply_ray_address(argparse.Namespace(ray_address=None))  # no flag: the variable as it was
    assert os.environ["RAY_ADDRESS"] == address


NO_RAY = "the ray pipeline's tests need the ray extra (pip install 'stallscope[ray]')"


@pytest.fixture(scope="module")
def instance() -> Iterator[str]:
    """One local Ray instance with one CPU for the module's in-process fault tests."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    path = {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    ray.init(num_cpus=1, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": path})  # fmt: skip
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


class Items:
    """Items that write the Ray worker's pid where the test can read it (to kill that worker)."""

    def __init__(self, pid_file: str) -> None:
        self.pid_file = pid_file

    def __len__(self) -> int:
        return 48

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import torch

        Path(self.pid_file).write_text(str(os.getpid()))
        time.sleep(0.005)
        return torch.full((3, 4, 4), float(i)), i % 5


def _built(tmp_path: Path) -> Any:
    import pipelines
    from pipelines import LoaderSpec

    return pipelines.get("ray").build(Items(str(tmp_path / "pid")), LoaderSpec(batch_size=4, workers=1, shuffle=False))


def test_no_cpu_free_is_one_line_in_seconds(instance: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from pipelines import ray_data

    monkeypatch.setattr(ray_data, "NO_CPU_WAIT_S", 2.0)

    @ray.remote(num_cpus=1)
    class Holder:  # another job's actor, holding the instance's only CPU
        def ping(self) -> int:
            return 1

    holder = Holder.remote()  # type: ignore[attr-defined]
    ray.get(holder.ping.remote())
    built = _built(tmp_path)
    t0 = time.perf_counter()
    try:
        with pytest.raises(ray_data.RayUnavailable) as e:
            next(iter(built.batches))
    finally:
        ray.kill(holder)
        built.close()
    line = built.worker_failure(e.value)
    assert line == str(e.value) and "\n" not in line, line
    assert line.startswith("the Ray instance has no CPU free for Ray Data's tasks (already running (shared)): 1 CPU")
    assert time.perf_counter() - t0 < 15  # Ray's own wait for a CPU has no end


def test_a_worker_killed_mid_epoch_is_said_and_survived(instance: str, tmp_path: Path) -> None:
    built = _built(tmp_path)
    got = 0
    try:
        for _batch in built.batches:
            got += 1
            if got == 3:  # the worker preparing the batches: Ray re-runs its tasks on a new one
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
    finally:
        built.close()
    assert got == 12 and built.config["ray_stats"]["batches"] == 12
    assert built.config["ray_workers_lost"] == 1, built.config.get("ray_workers_lost_detail")
    view = ray_view(built.config, data_wait_ms=1.0, steps=12)
    assert view is not None and view.headline.startswith("Ray lost 1 worker process(es) mid-run")


SCENARIO = """
import os, time
import torch
from torch import nn
from scenarios import Scenario

FLAG = {flag!r}

class Items(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        if i == 40 and not os.path.exists(FLAG):  # once, in the Ray worker preparing item 40: killed
            open(FLAG, "w").close()
            os.kill(os.getpid(), 9)
        time.sleep(0.002)
        return torch.full((4,), float(i % 7)), i % 3

scenario = Scenario(name="raykill", dataset=Items, model=lambda: nn.Linear(4, 3), loss=nn.functional.cross_entropy,
                    batch_size=8, steps=12, warmup=1, description="a Ray worker killed once, mid-run")
"""


def _ray_processes(root: str) -> list[int]:
    """This machine's processes started under Ray's temporary directory ``root`` (its GCS server, raylet, workers:
    their environment names it as RAY_TMPDIR)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"RAY_TMPDIR={root}".encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.slow
def test_a_run_whose_ray_worker_is_killed_keeps_its_record_and_leaves_no_ray_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("ray", reason=NO_RAY)
    root = tempfile.mkdtemp(prefix="rr", dir="/tmp")  # short: Ray's socket paths live under it
    scenario = tmp_path / "raykill.py"
    scenario.write_text(SCENARIO.format(flag=str(tmp_path / "killed")))
    out = tmp_path / "run"
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # a local instance, started for the run
    monkeypatch.setenv("RAY_TMPDIR", root)  # in the environment of every process Ray starts (_ray_processes)
    res = stallscope("run", str(scenario), "--pipeline", "ray", "--device", "cpu", "--no-live", "--out", str(out),
                     timeout=400)  # fmt: skip
    monkeypatch.delenv("RAY_TMPDIR")
    assert res.returncode == 0, res.stderr[-2000:]
    assert (tmp_path / "killed").exists()  # the kill did happen
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 12 and summary["ray"]["batches"] >= 13
    assert summary["ray"]["headline"].startswith("Ray lost 1 worker process(es) mid-run")
    report = stallscope("report", str(out))
    assert report.returncode == 0 and "Ray lost 1 worker process(es) mid-run" in report.stdout
    assert wait_until(lambda: not _ray_processes(root), timeout=20), _ray_processes(root)
    shutil.rmtree(root, ignore_errors=True)  # kept where the check failed: Ray's logs of what was left
