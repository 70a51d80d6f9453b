"""Ray Data's own stats beside the loop's data wait: the loader-stage view of a ``--pipeline ray`` run.

The ``ray`` pipeline stores Ray's figures for its latest epoch in the loader's config (``meta.loader.ray_stats``,
``pipelines.ray_stats``): per operator the remote wall and CPU seconds summed over its tasks, the rows it put out,
its tasks and the streaming executor's backpressure on it; for the iteration the seconds the training thread was
blocked in ``iter_batches``, the first batch's share of them and the batches delivered. This module reads that
record and puts Ray's steady-state blocked time per batch beside the data wait stallscope measured per step on its
own clock. Every figure here except ``loop_data_wait_ms``, ``loop_epoch_wait_ms`` and the run's start-up (the
pipeline's own, ``startup_*``: its first steps, until every Ray CPU had run a task) is Ray's, and says so when
rendered; nothing is re-measured. Ray counts every batch of the epoch, the run's warm-up steps' included, so the
loop's wait is compared over the same batches (the run's last ``batches`` steps), not over the measured steps alone.
Pure: no I/O, no Ray import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TypedDict

from profiler.analysis.meta import JSON
from profiler.analysis.stats import json_safe

LABEL = "Ray's"
METHOD = (
    "Ray Data's own stats for the run's last epoch (Dataset.get_stats_summary(): per operator, summed over its "
    "tasks; the iteration's timers: the training thread blocked in iter_batches), read by the pipeline at the "
    "epoch's end; the loop's data wait is stallscope's own clock, over the measured steps"
)
APART = 0.10  # Ray's blocked time per batch and the loop's wait per step this far apart: said in the headline


@dataclass(frozen=True, slots=True)
class RayOperator:
    """One Ray Data operator, Ray's figures (NaN where Ray gave none)."""

    name: str
    wall_s: float  # the operator's tasks' wall seconds, summed
    cpu_s: float  # their CPU seconds, summed
    rows: float  # rows put out
    tasks: int
    backpressure_s: float  # wall seconds the executor could launch none of its tasks
    output_backpressure_s: float  # wall seconds the executor read none of its outputs

    @property
    def cpu_ms_per_row(self) -> float:
        return 1e3 * self.cpu_s / self.rows if self.rows > 0 else math.nan

    @property
    def wall_ms_per_row(self) -> float:
        return 1e3 * self.wall_s / self.rows if self.rows > 0 else math.nan


@dataclass(frozen=True, slots=True)
class RayView:
    """Ray's own figures for the last epoch beside the loop's data wait (stallscope's clock)."""

    operators: tuple[RayOperator, ...]
    batches: int  # batches Ray delivered in the epoch
    blocked_s: float  # Ray's: the training thread blocked in iter_batches, the first batch included
    first_batch_s: float  # Ray's: the wait for the epoch's first batch (the executor's start, the first blocks)
    production_wait_s: float  # Ray's: of blocked_s, waiting on upstream production
    user_code_s: float  # Ray's: the training thread in the loop's own code between batches
    loop_data_wait_ms: float  # MEASURED by stallscope: the data wait per measured step
    steps: int  # the measured steps loop_data_wait_ms is over
    # MEASURED by stallscope over Ray's own batches: the loop's data wait per step over the epoch's steps after its
    # first (the run's last ``batches`` steps, warm-up included, as Ray counts them); NaN when the run recorded
    # fewer steps than Ray delivered batches
    loop_epoch_wait_ms: float
    headline: str
    workers_lost: int = 0  # Ray's worker processes lost mid-run (killed, crashed): Ray re-ran their tasks
    # MEASURED by the pipeline (its clock and the batches' worker pids, pipelines.ray_data.StartUp): the run's first
    # ``startup_steps`` steps, until every one of ``startup_cpus`` Ray CPUs had run a task (``startup_workers``
    # distinct workers delivered), ``startup_ms`` from the first epoch's start; held out of the measured steps
    # (profiler.analysis.apart). 0 steps: none held (``startup_end`` says why)
    startup_steps: int = 0
    startup_ms: float = math.nan
    startup_cpus: int = 0
    startup_workers: int = 0
    startup_end: str = ""
    method: str = METHOD

    @property
    def blocked_ms_per_batch(self) -> float:
        """Ray's blocked time per batch after the first: the steady state the loop's measured steps are in."""
        if self.batches < 2 or math.isnan(self.blocked_s):
            return math.nan
        first = 0.0 if math.isnan(self.first_batch_s) else self.first_batch_s
        return 1e3 * max(0.0, self.blocked_s - first) / (self.batches - 1)

    @property
    def apart(self) -> float:
        """(Ray's blocked ms per batch - the loop's data wait per step over the same batches) / the loop's; NaN when
        either is missing."""
        ray, loop = self.blocked_ms_per_batch, self.loop_epoch_wait_ms
        return (ray - loop) / loop if loop > 0 and not math.isnan(ray) else math.nan

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        out["source"] = (
            f"{LABEL} own: every figure but loop_data_wait_ms and loop_epoch_wait_ms (stallscope's clock) and the "
            "startup_ figures (the pipeline's clock and its batches' worker pids)"
        )
        out["blocked_ms_per_batch"] = self.blocked_ms_per_batch
        out["apart"] = self.apart
        out["operators"] = [
            {**asdict(op), "cpu_ms_per_row": op.cpu_ms_per_row, "wall_ms_per_row": op.wall_ms_per_row}
            for op in self.operators
        ]
        return json_safe(out)


def _num(v: object) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _operator(raw: object) -> RayOperator | None:
    if not isinstance(raw, dict):
        return None
    tasks = raw.get("tasks")
    return RayOperator(
        name=str(raw.get("operator") or "?"),
        wall_s=_num(raw.get("wall_s")),
        cpu_s=_num(raw.get("cpu_s")),
        rows=_num(raw.get("rows")),
        tasks=tasks if isinstance(tasks, int) else 0,
        backpressure_s=_num(raw.get("backpressure_s")),
        output_backpressure_s=_num(raw.get("output_backpressure_s")),
    )


def epoch_wait_ms(step_waits_s: Sequence[float], batches: int) -> float:
    """The loop's data wait per step over the last ``batches`` steps but their first: Ray's steady state, on
    stallscope's clock (Ray's epoch ends where the run does: the pipeline reads its stats when the loop closes it)."""
    if batches < 2 or len(step_waits_s) < batches:
        return math.nan
    return 1e3 * math.fsum(step_waits_s[len(step_waits_s) - batches + 1 :]) / (batches - 1)


def ray_view(
    loader: object,
    *,
    data_wait_ms: float,
    steps: int,
    step_waits_s: Sequence[float] = (),
    startup_held: bool = True,
) -> RayView | None:
    """The view from the loader's config (``meta.loader``) of a run; None where it holds no ``ray_stats``.
    ``data_wait_ms``: the loop's measured data wait per step over ``steps`` measured steps; ``step_waits_s``:
    every recorded step's data wait, in order, warm-up included (:func:`epoch_wait_ms`); ``startup_held``: whether
    the analysis held the start-up out of the measured steps (``profiler.analysis.apart.startup_held``)."""
    if not isinstance(loader, dict) or not isinstance(stats := loader.get("ray_stats"), dict):
        return None
    ops = tuple(op for raw in stats.get("operators") or [] if (op := _operator(raw)) is not None)
    raw_batches = stats.get("batches")
    batches = raw_batches if isinstance(raw_batches, int) else 0
    view = RayView(
        operators=ops,
        batches=batches,
        blocked_s=_num(stats.get("user_thread_blocked_s")),
        first_batch_s=_num(stats.get("first_batch_s")),
        production_wait_s=_num(stats.get("blocked_on_production_s")),
        user_code_s=_num(stats.get("user_code_s")),
        loop_data_wait_ms=data_wait_ms,
        steps=steps,
        loop_epoch_wait_ms=epoch_wait_ms(step_waits_s, batches),
        headline="",
        workers_lost=lost if isinstance(lost := loader.get("ray_workers_lost"), int) else 0,
        **_startup(loader, startup_held),
    )
    return replace(view, headline=headline(view))


class _StartUp(TypedDict):
    startup_steps: int
    startup_ms: float
    startup_cpus: int
    startup_workers: int
    startup_end: str


def _startup(loader: dict[str, object], held: bool) -> _StartUp:
    """The start-up's figures as the pipeline stored them (absent: none); ``held``: held out of the measured steps."""

    def count(key: str) -> int:
        v = loader.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0

    end = loader.get("startup_end")
    end = end if isinstance(end, str) else ""
    if count("startup_steps") and not held:
        end += "; it lasted past the measured steps, so it is not held out: the figures include it"
    return {
        "startup_steps": count("startup_steps") if held else 0,
        "startup_ms": _num(loader.get("startup_ms")),
        "startup_cpus": count("startup_cpus"),
        "startup_workers": count("startup_workers"),
        "startup_end": end,
    }


def startup_line(view: RayView) -> str:
    """The start-up in words ("" where the run recorded none)."""
    if view.startup_steps > 0:
        return (
            f"Ray's start-up: steps 0-{view.startup_steps - 1} ({view.startup_ms / 1e3:.2f} s from the first epoch's "
            f"start; {view.startup_end}), held out of the measured steps with the warm-up"
        )
    return f"Ray's start-up: none held out ({view.startup_end})" if view.startup_end else ""


def _ms(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{v:.1f} ms"


def headline(view: RayView) -> str:
    """Ray's blocked time per batch against the loop's data wait per step, and the operator with the most CPU."""
    out = (
        f"Ray lost {view.workers_lost} worker process(es) mid-run (killed or crashed): Ray re-ran their tasks, "
        "so the run went on and its figures hold the re-runs; "
        if view.workers_lost
        else ""
    )
    if math.isnan(view.blocked_ms_per_batch):
        out += f"Ray's timers hold no steady state ({view.batches} batch(es) in the last epoch)"
    else:
        out += (
            f"{LABEL} timers: the training thread blocked {_ms(view.blocked_ms_per_batch)} a batch in iter_batches "
            f"after the first ({view.batches} batches of the last epoch); stallscope's clock: "
            f"{_ms(view.loop_epoch_wait_ms)} of data wait a step over the same batches"
        )
        if not math.isnan(view.apart):
            out += f" ({view.apart:+.0%}{', apart: see the method' if abs(view.apart) > APART else ''})"
    busiest = max(
        (op for op in view.operators if not math.isnan(op.cpu_ms_per_row)), key=lambda op: op.cpu_s, default=None
    )
    if busiest is not None:
        out += f"; most CPU ({LABEL}): {busiest.name}, {busiest.cpu_ms_per_row:.2f} ms a row"
    return out + (f"; {line}" if (line := startup_line(view)) else "")
