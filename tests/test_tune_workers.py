"""The tuner's worker ceiling on real loaders of known cost (``tests/data/scenarios/``): one whose items wait
(io_wait.py: 20 ms of sleep, no CPU) must be climbed past the cores while throughput rises, one whose items
compute (cpu_loader.py: 5 ms of CPU each) stops at the cores, each saying why. In-process
(``profiler.cli.main``), each trial capped at 1 measured second."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from pipelines import usable_cores
from profiler.analysis import summarize
from profiler.cli import main
from profiler.core.store import load_run

SCENARIOS = ROOT / "tests" / "data" / "scenarios"
# the batch held at the scenarios' 8 (the truths are about workers; a batch climb added 4 trials and 9 final runs)
ARGS = ["--pipelines", "naive", "--batch-sizes", "8", "--budget-s", "120", "--seconds", "1", "--no-live", "--json"]


def tune(scenario: str, out: Path, capsys: pytest.CaptureFixture[str], *more: str) -> dict[str, Any]:
    rc = main(["tune", str(SCENARIOS / scenario), *ARGS, *more, "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    d: dict[str, Any] = json.loads(captured.out)
    return d


def busy(rows: list[dict[str, Any]]) -> list[float]:
    return [r["worker_cpu_busy_fraction"] for r in rows if r["worker_cpu_busy_fraction"] is not None]


@pytest.mark.skipif(usable_cores() > 4, reason="the injected costs put the best at 8 workers, past 2-4 cores")
def test_a_waiting_loader_is_tuned_past_the_cores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # past the cores: 8, where the injected costs put the best (16 added 3 runs of a count that ties with 8, a
    # trial, its re-run and a runner-up in the final rounds, and 32 two more)
    d = tune("io_wait.py", tmp_path / "io", capsys, "--max-workers", "8")
    tried = [r["workers"] for r in d["trials"]]
    assert max(tried) > d["cores"], tried  # the old search stopped at the cores
    assert d["recommended"]["workers"] >= 4, d["recommended"]
    # injected: w workers deliver 50w samples/s (8 items of 20 ms a batch each) up to the model's B / its step's
    # compute (the 20 ms forward sleep: 400 at batch 8, from 8 workers on), 44 at the default; the final figure of
    # what it recommends matches that (CI once recommended fewer than 8 workers on a busy host, a climb stopped by
    # a noisy trial: 261). The model's bound is its compute as timed in the same final runs: beside busy
    # processes the forward wakes from its sleep late (a 20 ms sleep took 24 ms) and 400 was out of reach.
    rec = d["recommended"]
    finals = [r for r in d["final"] if r["role"] == "recommended"]
    compute_s = statistics.median(r["breakdown_ms_per_step"]["compute"] for r in finals) / 1e3
    assert 0.020 <= compute_s < 0.060, compute_s  # the forward's 20 ms sleep, and what the host added to it
    # the training process's own time a step, from the same final runs: the step less the wait its loader caused,
    # that is the data wait less the part of it the training thread spent waiting for a CPU (schedstat): beside
    # two busy processes a 16-worker pick read 219 samples/s against 0.75 x 302 from its compute alone, while
    # its training thread waited for a CPU 3.3 and 6.8 ms of its 7.1 and 11.8 ms of data wait a step
    own_s = statistics.median(_own_step_ms(r["run_dir"]) for r in finals) / 1e3
    injected = min(50.0 * rec["workers"], rec["batch_size"] / own_s)
    assert d["final_median_samples_per_s"]["recommended"] >= 0.75 * injected, (rec, d["final_median_samples_per_s"])
    assert d["speedup"] > 4, d["speedup"]
    # the workers sleep: well under a tenth of a core each (sampled) wherever the sampler saw them
    assert busy(d["trials"]) and max(busy(d["trials"])) < 0.1, busy(d["trials"])
    assert d["stopped"]["naive"]["workers"].startswith(f"stopped at {d['recommended']['workers']}: ")


def _own_step_ms(run_dir: str) -> float:
    s = summarize(load_run(run_dir))
    runq = s.contention.runq_ms_per_step if s.contention is not None and s.contention.available else {}
    return s.step_time_ms.mean - max(0.0, s.breakdown_ms_per_step.data_wait - runq.get("data_wait", 0.0))


def assert_past_the_cores_only_where_allowed(trials: list[dict[str, Any]], cores: int) -> None:
    """Each worker count past the cores, first tried at a batch, was a step the measured ceiling allowed there (an
    earlier trial of fewer workers at that batch busy f of the time with f x w <= cores; unsampled: throughput
    alone decided), or a batch step at those workers (the search revisits: a CI run's batch climb from batch 4 at 4
    workers tried batch 8 at 4, past the ceiling that batch 8 at 2 workers had read)."""
    for i, r in enumerate(trials):
        w, b, before = r["workers"], r["batch_size"], trials[:i]
        if w <= cores or any(t["workers"] == w and t["batch_size"] == b for t in before):
            continue
        by_batch = any(t["workers"] == w for t in before)
        fewer = [t for t in before if t["batch_size"] == b and 0 < t["workers"] < w]
        allowed = any(
            t["worker_cpu_busy_fraction"] is None or t["worker_cpu_busy_fraction"] * w <= cores for t in fewer
        )
        assert by_batch or allowed, (r["config"], [(t["config"], t["worker_cpu_busy_fraction"]) for t in before])


def test_a_computing_loader_stops_at_the_cores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On an idle machine the workers have the cores to themselves and read ~100% busy: the climb stops at the
    cores without trying more. Beside other jobs a worker gets a share of a core, reads partly idle, and more
    workers than cores can be tried (they take share from the other jobs): then the test checks that every
    step past the cores was one the measured ceiling allowed, and that the reason names the figures."""
    d = tune("cpu_loader.py", tmp_path / "cpu", capsys, "--max-workers", "4")
    cores = d["cores"]
    rows: dict[int, dict[str, Any]] = {}
    for r in d["trials"]:  # each count's first trial: a second (measured again) is pooled with it, its CPU use kept
        if r["batch_size"] == 8:
            rows.setdefault(r["workers"], r)
    # injected: one worker burns CPU all the time it prepares a batch (40 ms of CPU a batch, timed on its own CPU
    # clock; the model sleeps 10 ms), so it is the bottleneck and its CPU share is at least the batches the run
    # took times 40 ms. A fixed floor of 25% read 23.2% beside busy processes, where a worker gets part of a core
    # (the fewest workers tried: the climb may be seeded at the cores, its first trial loader-bound), and each of
    # w workers at least 1 / w of that
    fewest = min(w for w in rows if w > 0)
    one = rows[fewest]
    need = one["throughput_samples_per_s"] / 8 * 0.040 / fewest
    assert one["worker_cpu_busy_fraction"] >= 0.8 * need > 0.1, (one["worker_cpu_busy_fraction"], need, fewest)
    why = d["stopped"]["naive"]["workers"]
    at_cores = rows.get(cores, {}).get("worker_cpu_busy_fraction")
    if at_cores is not None and at_cores >= 0.75:  # the cores were the workers': no more fit
        assert max(rows) == cores, sorted(rows)
        assert why.startswith(f"stopped at {cores}: "), why  # (after "seeded at ..." where the climb was seeded)
        assert f"the workers were {at_cores:.0%} busy on CPU per item at {cores}" in why, why
    else:
        assert_past_the_cores_only_where_allowed(d["trials"], cores)
        assert any(s in why for s in ("faster than", "slower than", "busy on CPU", "--max-workers")), why
    # the loader's 40 ms of CPU a batch overlaps the model's 10 ms sleep only in a worker: worth 1.25-2.5x with
    # free cores, 1.08 beside two busy processes (the workers get no more CPU than the main process had), so
    # the check is the one that holds on any host: a worker configuration, faster than the default side by side
    assert d["recommended"]["workers"] >= 1, d["recommended"]
    assert d["speedup"] is not None and d["speedup"] > 1.0, d["speedup"]
