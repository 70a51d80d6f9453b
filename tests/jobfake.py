"""Fake multi-rank jobs for the job-report tests: each rank a real :class:`profiler.Session` run with injected
sleeps (data wait, compute, sync) timed into a :class:`conftest.Truth`, the ranks running at once on threads as a
data-parallel job's would; a node sampler store (a Session with no steps, its ``rank{R}.cpu_pct`` samples written
through the store); and the launcher's job.json."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conftest import Truth

from profiler import Session
from profiler.core.store import load_run

STEPS, WARMUP = 10, 2


@dataclass
class RankPlan:
    wait_s: float = 0.0005
    compute_s: float = 0.015
    sync_s: float = 0.0
    nested: bool = False  # sync as compute/sync (real DDP) instead of a top-level phase (simulated devices)
    truth: Truth = field(default_factory=Truth)  # each sleep as it ran
    # the same spans timed from the rank's loop: around its ``next()`` on the wrapped loader and around its
    # ``phase("sync")`` block, so they hold all the session timed and the session's own bookkeeping besides.
    # Ranks are threads of one process: beside busy processes a thread whose sleep ended can wait for the GIL
    # and a core outside the sleep (a stress pass: 61.4 ms of data wait recorded against 47.1 of sleep)
    outer: Truth = field(default_factory=Truth)

    def bracket(self, label: str, measured_ms: float, rel: float = 0.10, abs_ms: float = 0.3) -> bool:
        """``measured_ms`` within the sleeps' mean and the loop's (each +- ``rel`` and ``abs_ms``), measured steps."""
        lo, hi = self.truth.mean_ms(label, skip=WARMUP), self.outer.mean_ms(label, skip=WARMUP)
        return lo * (1 - rel) - abs_ms <= measured_ms <= hi * (1 + rel) + abs_ms


def loader(plan: RankPlan, n: int) -> Any:
    for _ in range(n):
        plan.truth.sleep("data_wait", plan.wait_s)
        yield [0] * 8


def run_rank(out: Path, rank: int, world: int, plan: RankPlan, job_id: str, *, node_rank: int = 0) -> None:
    meta = {"rank": rank, "world_size": world, "local_rank": rank, "node_rank": node_rank, "job_id": job_id}
    with Session(out, sample_hz=5, device="cpu", warmup=WARMUP, sources=[], meta={"scenario": "fake", **meta}) as s:
        batches = iter(s.wrap(loader(plan, STEPS + WARMUP)))
        while True:
            t0 = time.perf_counter()
            if next(batches, None) is None:
                break
            plan.outer.add("data_wait", time.perf_counter() - t0)
            with s.phase("compute"):
                plan.truth.sleep("compute", plan.compute_s)
                if plan.nested:
                    sync(s, plan)
            if not plan.nested:
                sync(s, plan)


def sync(s: Session, plan: RankPlan) -> None:
    t0 = time.perf_counter()
    with s.phase("sync"):
        plan.truth.sleep("sync", plan.sync_s)
    plan.outer.add("sync", time.perf_counter() - t0)


def run_ranks(job_dir: Path, plans: dict[int, RankPlan], world: int, job_id: str, node_rank: int = 0) -> None:
    threads = [
        threading.Thread(
            target=run_rank, args=(job_dir / f"rank-{r}", r, world, p, job_id), kwargs={"node_rank": node_rank}
        )
        for r, p in plans.items()
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def node_store(job_dir: Path, node_rank: int, job_id: str, cpu: dict[int, float]) -> None:
    """The node sampler's store: ``cpu[R]`` for rank R inside each rank's measured window (on the node's clock,
    through both stores' started_at), and 999 outside it, so a test sees that the window is used."""
    windows = {}
    for r in cpu:
        rec = load_run(job_dir / f"rank-{r}")
        measured = [s for s in rec.steps if not s.warmup]
        windows[r] = (float(rec.meta["started_at"]), measured[0].t_start, measured[-1].t_end)
    node = Session(  # threads: this fixture writes the node's readings into its store directly
        job_dir / f"node-{node_rank}",
        sample_hz=5,
        sources=[],
        meta={"job_id": job_id, "node_rank": node_rank},
        sampling="thread",
    )
    node.start()
    rec_ = node.recording
    assert rec_ is not None and rec_.store is not None
    node_started = float(rec_.store.record().meta["started_at"])
    rows = []
    for r, value in cpu.items():
        started, a, b = windows[r]
        lo, hi = started - node_started + a, started - node_started + b
        for k in range(-20, 60):
            t = lo + (hi - lo) * k / 40
            rows.append((t, "host", f"rank{r}.cpu_pct", value if lo <= t <= hi else 999.0))
    rec_.store.put_samples(rows)
    node.close()


def job_json(job_dir: Path, **fields: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "job_id": "job-a",
        "nproc_per_node": 2,
        "nnodes": 1,
        "node_rank": 0,
        "world_size": 2,
        "backend": "gloo",
        "scenario": "fake",
        "pipeline": "naive",
        "device": "cpu",
        "batch_size": 8,
        "workers": 0,
        "ranks": [0, 1],
        "started_at": time.time() - 60,
        "ended_at": time.time(),
        "status": "complete",
        "rank_exits": [],
        "first_failure": None,
        "baseline": None,
    }
    doc.update(fields)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "job.json").write_text(json.dumps(doc))
    return doc
