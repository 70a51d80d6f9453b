"""Sweep analysis: per-configuration rows -> the table, the knee of each throughput curve, and every
slowdown (a larger batch that trained slower than the next smaller one) explained from the measured breakdown.

Pure: rows in, dataclasses out; no clock, no file, no rendering. ``profiler/sweep/run.py`` builds rows with
:func:`row_from_summary`; the terminal table, the plot and ``sweep.json`` all read the :class:`SweepResult`
returned here, so they agree digit for digit. Only rows that completed with a finite throughput
(``SweepRow.ok``) are on a line; failed rows stay in the table. docs/sweep-and-tune.md defines the early stop
(``MIN_STEPS``, ``REL_CI``), the knee (``KNEE_TOLERANCE``), a slowdown (``SLOWDOWN_MIN_DROP``) and its cause,
a job row's ``speedup`` and ``scaling_efficiency``, and the workers' CPU busy fraction.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from itertools import pairwise
from typing import Any

from profiler.analysis.meta import JSON
from profiler.analysis.parts import HostFigures
from profiler.analysis.stats import json_safe, mean
from profiler.analysis.summary import Summary, cost_figures
from profiler.jobs.analysis import JobSummary

MIN_STEPS = 5
REL_CI = 0.05
KNEE_TOLERANCE = 0.05
SLOWDOWN_MIN_DROP = 0.05

# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal 1.96 plus a small
# correction (within 0.2% of the exact value from 31 on).
_T95 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def t95(df: int) -> float:
    """The 97.5% quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df


def relative_ci(values: Sequence[float]) -> float:
    """Half-width of the 95% confidence interval of the mean of ``values``, divided by the mean.

    ``inf`` for fewer than two values or a non-positive mean: nothing is known yet.
    """
    n = len(values)
    m = mean(values)
    if n < 2 or not m > 0:
        return math.inf
    var = math.fsum((v - m) ** 2 for v in values) / (n - 1)
    return t95(n - 1) * math.sqrt(var / n) / m


def is_stable(step_s: Sequence[float], min_steps: int = MIN_STEPS, rel_ci: float = REL_CI) -> bool:
    """The early-stop rule: enough measured steps, and a mean step time known to within ``rel_ci``."""
    return len(step_s) >= min_steps and relative_ci(step_s) < rel_ci


@dataclass(frozen=True, slots=True)
class SweepRow:
    """One configuration's outcome. Figures are NaN (null in JSON) for a configuration that did not complete."""

    pipeline: str
    batch_size: int
    workers: int
    status: str  # "complete" | "failed" | "interrupted"
    run_dir: str | None = None
    error: str | None = None
    throughput_samples_per_s: float = math.nan
    stall_fraction: float = math.nan
    device_busy_fraction: float = math.nan
    step_time_ms: dict[str, float] = field(default_factory=dict)  # mean, p50, p90
    breakdown_ms_per_step: dict[str, float] = field(default_factory=dict)  # data_wait, h2d, compute, other
    steps: int = 0
    warmup_steps: int = 0
    stop_reason: str | None = None  # "stable" | "steps" | "seconds": why the measured window ended
    step_time_rel_ci: float = math.nan  # 95% CI half-width of the mean step time / the mean
    own_step_rel_ci: float = math.nan  # the same of each step less its run-queue wait, where measured
    cost_per_1k_samples: float | None = None
    wall_s: float = math.nan  # the whole configuration: set-up, warm-up, measured steps, tear-down
    role: str | None = None  # tune only: "trial", "recommended", "default"
    worker_cpu_busy_fraction: float = math.nan  # see the module docstring; sampled, not per item
    workers_sampled: int = 0  # worker processes with a CPU sample in the measured window
    # share of compute time the training thread waited for a CPU (run queue), when the run measured it
    runq_compute_fraction: float = math.nan
    nproc: int = 1  # ranks of a data-parallel job (profiler.jobs.launch); throughput is then the sum over ranks
    sync_ms_per_step: float = math.nan  # a job's mean over ranks of the time blocked waiting for the others
    # a job against nproc 1 of the same pipeline / batch / workers (analyse_sweep fills them in, measured ratios):
    speedup: float = math.nan  # throughput / that row's throughput
    scaling_efficiency: float = math.nan  # speedup / nproc
    speedup_baseline: str | None = None  # the config name of that row
    prefetch_factor: int | None = None  # the loader knobs the configuration set (Config's; None: not set)
    pin_memory: bool | None = None

    @property
    def config(self) -> Config:
        return Config(self.pipeline, self.batch_size, self.workers, self.nproc, self.prefetch_factor, self.pin_memory)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def ok(self) -> bool:
        """Completed with a usable throughput: only such rows enter knees, slowdowns and the tuner's choices."""
        thr = self.throughput_samples_per_s
        return self.status == "complete" and math.isfinite(thr) and thr > 0

    def to_dict(self) -> JSON:
        row: JSON = asdict(self)
        return {"config": self.name, **json_safe(row)}


def row_from_dict(d: dict[str, Any]) -> SweepRow:
    """A row as ``SweepRow.to_dict`` wrote it (``sweep.json``, ``tune.json``): null figures are NaN again, and
    keys this version does not know (a newer stallscope's) are left out."""
    known = {f.name: f for f in fields(SweepRow)}
    values = {k: v for k, v in d.items() if k in known}
    for name, f in known.items():
        if values.get(name, 0) is None and isinstance(f.default, float) and math.isnan(f.default):
            values[name] = math.nan
    return SweepRow(**values)


def sweep_from_dict(d: dict[str, Any]) -> SweepResult:
    """The sweep as ``SweepResult.to_dict`` wrote it (``sweep.json``), re-analysed from its rows: what
    ``stallscope report SWEEP_DIR`` prints, also for a sweep stopped part-way (its rows so far)."""
    return analyse_sweep(
        [row_from_dict(r) for r in d["rows"]],
        scenario=str(d["scenario"]),
        device=str(d["device"]),
        planned=int(d["planned"]),
        status=str(d["status"]),
    )


@dataclass(frozen=True, slots=True)
class Config:
    """One point of a sweep or a tune: the knobs a run is configured by (``nproc`` > 1: a multi-rank job, sweep
    only; batch size and workers are then per rank)."""

    pipeline: str
    batch_size: int
    workers: int
    nproc: int = 1
    # the DataLoader knobs a tune sets (None: the pipeline's or the script's own): batches each worker loads ahead,
    # page-locked batches
    prefetch_factor: int | None = None
    pin_memory: bool | None = None

    @property
    def name(self) -> str:
        return config_name(self.pipeline, self.batch_size, self.workers, self.nproc) + self.knobs_suffix

    @property
    def knobs_suffix(self) -> str:
        """``-pf4``, ``-pin``, ``-nopin``: the knobs set, as the run directory's name ends ("" for none)."""
        pf = f"-pf{self.prefetch_factor}" if self.prefetch_factor is not None else ""
        return pf + ("" if self.pin_memory is None else "-pin" if self.pin_memory else "-nopin")

    def flags(self) -> str:
        """The ``stallscope run`` flags that train this configuration."""
        out = f"--pipeline {self.pipeline} --batch-size {self.batch_size} --workers {self.workers}"
        if self.prefetch_factor is not None:
            out += f" --prefetch-factor {self.prefetch_factor}"
        return out + ("" if self.pin_memory is None else f" --pin-memory {'on' if self.pin_memory else 'off'}")

    def to_dict(self) -> dict[str, str | int | bool]:
        out: dict[str, str | int | bool] = {
            "pipeline": self.pipeline, "batch_size": self.batch_size, "workers": self.workers,
        }  # fmt: skip
        out |= {"nproc": self.nproc} if self.nproc > 1 else {}  # tune.json's configurations stay as they were
        out |= {"prefetch_factor": self.prefetch_factor} if self.prefetch_factor is not None else {}
        return out | ({"pin_memory": self.pin_memory} if self.pin_memory is not None else {})


def config_from_dict(c: dict[str, Any]) -> Config:
    """A configuration as :meth:`Config.to_dict` wrote it."""
    return Config(
        c["pipeline"], c["batch_size"], c["workers"], c.get("nproc", 1), c.get("prefetch_factor"), c.get("pin_memory")
    )


def with_knobs(row: SweepRow, cfg: Config) -> SweepRow:
    """``row`` carrying ``cfg``'s loader knobs (rows are built from a run's figures, which name no knob)."""
    return replace(row, prefetch_factor=cfg.prefetch_factor, pin_memory=cfg.pin_memory)


def config_name(pipeline: str, batch_size: int, workers: int, nproc: int = 1) -> str:
    """The directory name of a configuration's run store, e.g. ``naive-b16-w2``; a job of N > 1 ranks (its job
    directory) ends ``-xN``: ``naive-b16-w2-x4``."""
    return f"{pipeline}-b{batch_size}-w{workers}" + (f"-x{nproc}" if nproc > 1 else "")


def row_from_summary(
    s: Summary,
    *,
    pipeline: str,
    batch_size: int,
    workers: int,
    run_dir: str | None,
    step_s: Sequence[float],
    stop_reason: str | None,
    wall_s: float,
    status: str | None = None,
    error: str | None = None,
    role: str | None = None,
    own_step_s: Sequence[float] = (),
) -> SweepRow:
    """A row from a configuration's summary; ``step_s`` are its measured step durations (for the CI),
    ``own_step_s`` the same less each step's run-queue wait (empty: not measured)."""
    status = status or s.status
    figures = status == "complete"
    per_1k = s.cost.per_1k_samples if s.cost else None
    busy, sampled = worker_cpu_busy(s.host, workers)
    return SweepRow(
        pipeline=pipeline,
        batch_size=batch_size,
        workers=workers,
        status=status,
        run_dir=run_dir,
        error=error or s.error,
        throughput_samples_per_s=s.throughput_samples_per_s if figures else math.nan,
        stall_fraction=s.stall_fraction if figures else math.nan,
        device_busy_fraction=s.device_busy_fraction if figures else math.nan,
        step_time_ms=s.step_time_ms.to_dict() if figures else {},
        breakdown_ms_per_step={k: s.breakdown_ms_per_step.get(k) for k in _PARTS} if figures else {},
        steps=s.steps,
        warmup_steps=s.warmup_steps,
        stop_reason=stop_reason,
        step_time_rel_ci=relative_ci(step_s) if step_s else math.nan,
        own_step_rel_ci=relative_ci(own_step_s) if own_step_s else math.nan,
        cost_per_1k_samples=per_1k if figures else None,
        wall_s=wall_s,
        role=role,
        worker_cpu_busy_fraction=busy if figures else math.nan,
        workers_sampled=sampled,
        runq_compute_fraction=_runq(s) if figures else math.nan,
    )


_PARTS = ("data_wait", "h2d", "compute", "other")


def row_from_job(
    js: JobSummary,
    cfg: Config,
    *,
    run_dir: str,
    step_s: Sequence[float],
    wall_s: float,
    status: str | None = None,
    error: str | None = None,
    price_per_hour: float | None = None,
) -> SweepRow:
    """A job configuration's row from its job summary (``nproc`` > 1): throughput the job's (the sum over ranks),
    step time the slowest rank's, stall / busy fractions and breakdown (sync included) the means over ranks.
    ``step_s``: the slowest rank's measured step durations (for the CI). A job runs a fixed number of steps, so
    its stop reason is "steps". ``price_per_hour``: the node's, so the cost per 1,000 samples is at the job's
    throughput."""
    status = status or js.status
    figures = status == "complete" and math.isfinite(js.throughput_samples_per_s)
    parts = js.breakdown_ms_per_step.to_dict()
    measured = [r.summary for r in js.ranks if r.measured and r.summary is not None]
    cost = cost_figures(price_per_hour, js.throughput_samples_per_s, None)
    return SweepRow(
        pipeline=cfg.pipeline,
        batch_size=cfg.batch_size,
        workers=cfg.workers,
        status=status,
        run_dir=run_dir,
        error=error,
        throughput_samples_per_s=js.throughput_samples_per_s if figures else math.nan,
        stall_fraction=js.stall_fraction if figures else math.nan,
        device_busy_fraction=js.device_busy_fraction if figures else math.nan,
        step_time_ms=js.step_time_ms.to_dict() if figures else {},
        breakdown_ms_per_step={k: parts.get(k, math.nan) for k in (*_PARTS, "sync")} if figures else {},
        steps=min((s.steps for s in measured), default=0),
        warmup_steps=measured[0].warmup_steps if measured else 0,
        stop_reason="steps" if figures else None,
        step_time_rel_ci=relative_ci(step_s) if step_s else math.nan,
        cost_per_1k_samples=cost.per_1k_samples if figures and cost else None,
        wall_s=wall_s,
        nproc=cfg.nproc,
        sync_ms_per_step=parts.get("sync", math.nan) if figures else math.nan,
    )


def worker_cpu_busy(host: HostFigures, workers: int) -> tuple[float, int]:
    """The workers' CPU busy fraction from a summary's ``host`` figures, and how many workers it averages."""
    if workers < 1:
        return math.nan, 0
    # per-worker means (``proc.w<i>.cpu_pct``); the children's sum would count a worker the sampler had
    # not seen yet as idle, and labels of workers restarted each epoch would add up
    per_worker = [v for v in host.worker_cpu_pct.values() if math.isfinite(v)]
    if not per_worker:
        return math.nan, 0
    return mean(per_worker) / 100.0, len(per_worker)


def _runq(s: Summary) -> float:
    """The training thread's run-queue share of compute (``summary.contention``); NaN where not measured."""
    c = s.contention
    return c.compute_runq_fraction if c is not None and c.available else math.nan


@dataclass(frozen=True, slots=True)
class Knee:
    pipeline: str
    workers: int
    batch_size: int
    throughput: float
    best_batch_size: int
    best_throughput: float
    tolerance: float
    text: str
    nproc: int = 1


@dataclass(frozen=True, slots=True)
class Slowdown:
    pipeline: str
    workers: int
    batch_size: int  # the larger batch, the one that trained slower
    smaller_batch_size: int
    throughput: float
    smaller_throughput: float
    drop: float  # 1 - throughput / smaller_throughput
    cause: str  # "loader" | "compute" | "other"
    added_ms_per_sample: dict[str, float]  # input, compute, other: growth of each part's time per sample
    text: str
    nproc: int = 1


@dataclass(frozen=True, slots=True)
class SweepResult:
    scenario: str
    device: str
    status: str  # "complete" | "interrupted"
    planned: int  # configurations asked for; len(rows) is how many ran
    rows: list[SweepRow]
    knee: Knee | None
    knees: list[Knee]
    slowdowns: list[Slowdown]
    priced: bool
    notes: list[str]

    @property
    def multi_rank(self) -> bool:
        """Some configuration is a job of several ranks: the table shows nproc, sync and speed-up."""
        return any(r.nproc > 1 for r in self.rows)

    def to_dict(self) -> JSON:
        """The ``sweep.json`` object (and ``sweep --json``): NaN becomes null."""
        return {
            "scenario": self.scenario,
            "device": self.device,
            "status": self.status,
            "planned": self.planned,
            "rows": [r.to_dict() for r in self.rows],
            "knee": json_safe(asdict(self.knee)) if self.knee else None,
            "knees": [json_safe(asdict(k)) for k in self.knees],
            "slowdowns": [json_safe(asdict(s)) for s in self.slowdowns],
            "rules": {
                "early_stop": f">= {MIN_STEPS} measured steps and 95% CI half-width of the mean step time "
                f"< {REL_CI:.0%} of the mean",
                "knee": f"smallest batch within {KNEE_TOLERANCE:.0%} of the best throughput of its pipeline x workers",
                "slowdown": f"throughput more than {SLOWDOWN_MIN_DROP:.0%} below the next smaller batch of its "
                "pipeline x workers",
                **(
                    {
                        "speedup": "a job's throughput (the sum over its ranks) / the throughput of nproc 1 of the "
                        "same pipeline, batch and workers; scaling_efficiency = speedup / nproc",
                    }
                    if self.multi_rank
                    else {}
                ),
            },
            "notes": list(self.notes),
        }


def lines(rows: Sequence[SweepRow]) -> dict[tuple[str, int, int], list[SweepRow]]:
    """Completed rows by (pipeline, workers, nproc), each list sorted by batch size, in first-seen line order."""
    out: dict[tuple[str, int, int], list[SweepRow]] = defaultdict(list)
    for r in rows:
        if r.ok:
            out[(r.pipeline, r.workers, r.nproc)].append(r)
    return {k: sorted(v, key=lambda r: r.batch_size) for k, v in out.items()}


def knee_of(line: Sequence[SweepRow], tolerance: float = KNEE_TOLERANCE) -> Knee | None:
    """The knee of one line (sorted by batch size); None for fewer than two points."""
    if len(line) < 2:
        return None
    best = max(line, key=lambda r: r.throughput_samples_per_s)
    floor = best.throughput_samples_per_s * (1 - tolerance)
    knee = next(r for r in line if r.throughput_samples_per_s >= floor)
    where = line_label(knee.pipeline, knee.workers, knee.nproc)
    if knee.batch_size == best.batch_size:
        text = (
            f"knee ({where}): batch {knee.batch_size}, the best at {knee.throughput_samples_per_s:.1f} samples/s; "
            f"every smaller batch is more than {tolerance:.0%} below it"
        )
    else:
        text = (
            f"knee ({where}): batch {knee.batch_size} reaches {knee.throughput_samples_per_s:.1f} samples/s, within "
            f"{tolerance:.0%} of the best {best.throughput_samples_per_s:.1f} at batch {best.batch_size}: "
            "a larger batch buys little more"
        )
    return Knee(
        pipeline=knee.pipeline,
        workers=knee.workers,
        batch_size=knee.batch_size,
        throughput=knee.throughput_samples_per_s,
        best_batch_size=best.batch_size,
        best_throughput=best.throughput_samples_per_s,
        tolerance=tolerance,
        text=text,
        nproc=knee.nproc,
    )


def line_label(pipeline: str, workers: int, nproc: int = 1) -> str:
    """``naive, 2 workers`` (``, 4 ranks`` for a job line)."""
    ranks = f", {nproc} ranks" if nproc > 1 else ""
    return f"{pipeline}, {workers} worker{'' if workers == 1 else 's'}{ranks}"


def explain_slowdown(small: SweepRow, large: SweepRow) -> Slowdown:
    """Why ``large`` (the larger batch) trained slower than ``small``, from their measured breakdowns."""
    a, b = small.breakdown_ms_per_step, large.breakdown_ms_per_step
    na, nb = small.batch_size, large.batch_size
    in_a, in_b = a["data_wait"] + a["h2d"], b["data_wait"] + b["h2d"]
    step_a, step_b = small.step_time_ms["mean"], large.step_time_ms["mean"]
    added = {
        "input": in_b / nb - in_a / na,
        "compute": b["compute"] / nb - a["compute"] / na,
    }
    added["other"] = (step_b / nb - step_a / na) - added["input"] - added["compute"]
    cause_part = max(added, key=lambda k: added[k])
    cause = {"input": "loader", "compute": "compute", "other": "other"}[cause_part]
    thr_a, thr_b = small.throughput_samples_per_s, large.throughput_samples_per_s
    drop = 1 - thr_b / thr_a
    head = f"batch {nb} is {drop:.0%} slower than batch {na} ({thr_b:.1f} vs {thr_a:.1f} samples/s): "
    c_ratio = _ratio(b["compute"], a["compute"])
    if cause == "loader":
        copy_grew = b["h2d"] - a["h2d"] > b["data_wait"] - a["data_wait"]
        what, x, y = (
            ("the blocking copy", a["h2d"], b["h2d"]) if copy_grew else ("data wait", a["data_wait"], b["data_wait"])
        )
        body = (
            f"{what} grew from {_ms(x)} to {_ms(y)} ms per step{_times(y, x)} while compute grew {c_ratio} "
            f"for {nb / na:g}x the samples — "
            + (
                "copying the larger batch to the device blocks the step"
                if copy_grew
                else "the loader cannot keep up with the larger batch and the device waits"
            )
            + f" (stall {_pct(large.stall_fraction)}, was {_pct(small.stall_fraction)})"
        )
    elif cause == "compute":
        ca, cb = a["compute"] / na, b["compute"] / nb
        body = (
            f"compute per sample grew from {ca:.2f} to {cb:.2f} ms{_times(cb, ca)} while data wait went "
            f"{_ms(a['data_wait'])} -> {_ms(b['data_wait'])} ms per step — each sample costs more compute at the "
            "larger batch (memory or cache pressure: its working set no longer fits; on a GPU, allocator or "
            f"swap-out), not the loader (stall {_pct(large.stall_fraction)})"
        )
    else:
        body = (
            f"the added time is outside data wait, copy and compute (other grew from {_ms(a['other'])} to "
            f"{_ms(b['other'])} ms per step) — host work in the loop between the phases (logging, synchronisation, "
            f"garbage collection) grew with the batch (stall {_pct(large.stall_fraction)})"
        )
    tail = " [per sample: " + ", ".join(f"{k} {_signed(v)} ms" for k, v in added.items()) + "]"
    return Slowdown(
        pipeline=large.pipeline,
        workers=large.workers,
        batch_size=nb,
        smaller_batch_size=na,
        throughput=thr_b,
        smaller_throughput=thr_a,
        drop=drop,
        cause=cause,
        added_ms_per_sample=added,
        text=head + body + tail,
        nproc=large.nproc,
    )


def _signed(x: float) -> str:
    return f"{round(x, 2) + 0.0:+.2f}"  # + 0.0: no "-0.00" for a change that rounds to nothing


def _ms(x: float) -> str:
    return f"{x:.1f}" if abs(x) < 10 else f"{x:.0f}"


def _ratio(new: float, old: float) -> str:
    return f"x{new / old:.1f}" if old > 0.05 and math.isfinite(new / old) else f"from {_ms(old)} to {_ms(new)} ms"


def _times(new: float, old: float) -> str:
    return f" (x{new / old:.1f})" if old > 0.05 and math.isfinite(new / old) else ""


def _pct(x: float) -> str:
    return f"{x:.0%}" if math.isfinite(x) else "n/a"


def slowdowns_of(
    line: Sequence[SweepRow],
    min_drop: float = SLOWDOWN_MIN_DROP,
    unresolved: list[str] | None = None,
    contended: list[str] | None = None,
) -> list[Slowdown]:
    """Every row of a line (sorted by batch size) more than ``min_drop`` slower than its predecessor beyond the two
    rows' step-time uncertainty together (95% CI half-widths): a drop of ``min_drop`` is what matters, and it
    must stand clear of what noise could explain. Where both rows measured every step's wait for a CPU, the noise
    is that of the steps less that wait (``own_step_rel_ci``): a step the host kept off the cores is the host's
    noise, not the configuration's (beside two busy processes one such step widened a 60-step row's CI past the
    injected 40% drop of tests/data/scenarios/slowdown.py). A drop that does not is not claimed, but named in
    ``unresolved``. (With the drop required only to exceed the uncertainty, batch 32 of tests/data/scenarios/knee.py,
    as fast as batch 16 by design, was named slower than 16 in 2 of 4 CI runs, on a host whose load changed
    between the two.) Where both rows measured the training thread's wait for a CPU, the drop must also hold on
    the training's own time (the step less that wait): a drop the host's load explains is named in ``contended``,
    not blamed on the batch."""
    out = []
    for small, large in pairwise(line):
        if large.throughput_samples_per_s < small.throughput_samples_per_s * (1 - min_drop):
            drop = 1 - large.throughput_samples_per_s / small.throughput_samples_per_s
            noise = _noise(small, large)  # NaN (too few steps) compares False
            own = own_drop(small, large)
            if drop > min_drop + noise and not own <= min_drop + noise:  # NaN own (not measured): judged on drop
                out.append(explain_slowdown(small, large))
            elif drop > min_drop + noise and contended is not None:
                contended.append(f"{large.name} vs {small.name} ({drop:.0%} slower; {own:.0%} on its own time)")
            elif unresolved is not None:
                unresolved.append(f"{large.name} vs {small.name} ({drop:.0%} slower)")
    return out


def _noise(small: SweepRow, large: SweepRow) -> float:
    """The two rows' relative step-time uncertainty together: on the wall clock, or on their own time where both
    measured it and it is the narrower. The drop judged is one of wall-clock throughput, so the wall clock's spread
    bounds what noise can explain; the steps less their run-queue wait only take out the host's part of it. They
    never add noise: beside busy processes a sleeping thread's schedstat once counted a whole 1.66 s step as
    run-queue wait (a stress pass of tests/data/scenarios/knee.py), and those rows' +-1.9% wall-clock steps read
    +-51% on their own time, hiding the injected 50% drop."""
    wall = small.step_time_rel_ci + large.step_time_rel_ci
    own = small.own_step_rel_ci + large.own_step_rel_ci
    return min(own, wall) if math.isfinite(own) else wall


def own_step_ms(row: SweepRow) -> float:
    """The mean step less the training thread's wait for a CPU inside its compute (schedstat run delay): the
    step as the training would take it on cores of its own. NaN where the run did not measure that wait."""
    compute = row.breakdown_ms_per_step.get("compute")
    if compute is None or not math.isfinite(row.runq_compute_fraction):
        return math.nan
    return row.step_time_ms["mean"] - row.runq_compute_fraction * compute


def own_drop(small: SweepRow, large: SweepRow) -> float:
    """The larger batch's drop in samples/s against the smaller's, on their own time (:func:`own_step_ms`)."""
    a, b = own_step_ms(small), own_step_ms(large)
    if not (a > 0 and b > 0):
        return math.nan
    return 1 - (large.batch_size / b) / (small.batch_size / a)


def _unclaimed(unresolved: list[str], contended: list[str]) -> list[str]:
    """The notes that name drops not claimed as slowdowns, and why."""
    notes = []
    if unresolved:
        notes.append(
            "not flagged as slowdowns, the drop being within the step-time uncertainty (more --steps or --seconds "
            "would tell): " + "; ".join(unresolved)
        )
    if contended:
        notes.append(
            "not flagged as slowdowns, the training thread's wait for a CPU (schedstat run delay in compute) "
            "explaining the drop: the host's load changed between the runs, not the cost of the batch (run again "
            "on a quieter host): " + "; ".join(contended)
        )
    return notes


def analyse_sweep(
    rows: Sequence[SweepRow],
    *,
    scenario: str,
    device: str,
    planned: int,
    status: str = "complete",
    knee_tolerance: float = KNEE_TOLERANCE,
    slowdown_min_drop: float = SLOWDOWN_MIN_DROP,
) -> SweepResult:
    """The sweep's table, knees and slowdowns from its rows (in the order they ran)."""
    by_line = lines(rows)
    knees = [k for line in by_line.values() if (k := knee_of(line, knee_tolerance)) is not None]
    ok = [r for r in rows if r.ok]
    knee = None
    if ok:
        top = max(ok, key=lambda r: r.throughput_samples_per_s)
        knee = next(
            (k for k in knees if (k.pipeline, k.workers, k.nproc) == (top.pipeline, top.workers, top.nproc)), None
        )
    unresolved: list[str] = []
    contended: list[str] = []
    slow = [s for line in by_line.values() for s in slowdowns_of(line, slowdown_min_drop, unresolved, contended)]
    notes = _unclaimed(unresolved, contended)
    failed = [r for r in rows if r.status == "failed"]
    if failed:
        notes.append(f"{len(failed)} of {len(rows)} configurations failed: their rows carry the error")
    if len(rows) < planned:
        notes.append(f"{len(rows)} of {planned} configurations ran ({status})")
    if not knees:
        line = "pipeline x workers x nproc" if any(r.nproc > 1 for r in rows) else "pipeline x workers"
        notes.append(f"no {line} line has two completed batch sizes: no knee")
    rows, missing = with_speedups(rows)
    if missing:
        notes.append(
            "no speed-up for " + ", ".join(missing) + ": nproc 1 of the same pipeline, batch and workers did not "
            "complete in this sweep"
        )
    return SweepResult(
        scenario=scenario,
        device=device,
        status=status,
        planned=planned,
        rows=list(rows),
        knee=knee,
        knees=knees,
        slowdowns=slow,
        priced=any(r.cost_per_1k_samples is not None for r in rows),
        notes=notes,
    )


def with_speedups(rows: Sequence[SweepRow]) -> tuple[list[SweepRow], list[str]]:
    """``rows`` with every completed job row's ``speedup`` (its throughput / the throughput of nproc 1 of the same
    pipeline, batch and workers) and ``scaling_efficiency`` (speedup / nproc) filled in: ratios of the two measured
    throughputs. Also the names of the completed job rows that have no such single-rank row."""
    single = {(r.pipeline, r.batch_size, r.workers): r for r in rows if r.ok and r.nproc == 1}
    out, missing = [], []
    for r in rows:
        base = single.get((r.pipeline, r.batch_size, r.workers))
        if r.nproc > 1 and r.ok and base is not None:
            speedup = r.throughput_samples_per_s / base.throughput_samples_per_s
            out.append(replace(r, speedup=speedup, scaling_efficiency=speedup / r.nproc, speedup_baseline=base.name))
            continue
        if r.nproc > 1 and r.ok:
            missing.append(r.name)
        out.append(r)
    return out, missing
