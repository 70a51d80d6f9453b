"""What-if ``--ray-cpus N``: the run's loading moved to Ray Data ``map_batches`` tasks on N CPUs of this host's speed.
Pure: numbers in, a :class:`~profiler.whatif.model.Prediction` out.

What it takes, each measured (docs/whatif.md, "Ray Data on N CPUs"):

- the loader's CPU seconds per sample in the base run (``LoaderCost.cpu_s``; a ray base: Ray's own ``cpu_s`` per
  operator over its rows), plus its measured wait for storage, which holds a Ray CPU as it holds a worker;
- Ray's own cost, from a run on the ray pipeline (the base, or ``--ray-run``): what Ray's map tasks cost per sample
  beyond the base's loader (its block building and object-store put), the trainer's per-batch hand-off (Ray's
  "user thread blocked" time less its "blocked on production": fetching and converting a finished batch), and the
  host CPU per sample the whole ray run took outside its map tasks (the trainer's loop, Ray's driver threads,
  raylet): without such a run Ray's cost is left out, and said so;
- from the same run's host sampler, its task workers' loop threads (where a Ray worker runs its tasks): their CPU
  per sample beyond Ray's count of the tasks' (a task's start, the block's put), their wait for a core per CPU
  second, and their idle between tasks per batch where the run's loop waited for data (:class:`TaskWorkers`).

Remote CPUs (the default) take the tasks off this host: the loader's period is their CPU per batch over N, the
trainer's step gains the hand-off, and what stays here (the host CPU outside the tasks) shares the base run's free
cores. ``local`` (what ``--check`` measures: a Ray instance of N CPUs on this host) puts the tasks' CPU on those
cores too, and a Ray CPU holds a batch for its CPU seconds stretched as the ray run's workers' were (at another
CPU count by the change in the cores' fair share: ESTIMATED). How often Ray Data leaves a CPU without a task with
several local CPUs (two on a 2-core host idled 9-16 ms a batch each, one 0-2 ms; docs/whatif.md) only a ray run of
that many CPUs shows: each count takes the ray run of its own count where one was given (:func:`ray_cost_at`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from profiler.whatif.model import Host, LoaderCost, MeasuredRun, Prediction, Target, steady

RAY = "ray"
# a ray run's measured step this many times their median is an event (a task's start under load, 0.8-1.0 s at step 5
# of mlp-mnist's runs on a loaded 2-core host), not the steady state: said so beside the predictions
LONG_STEP = 10.0


@dataclass(frozen=True, slots=True)
class RayFigures:
    """What one run on the ray pipeline measured of Ray: Ray's own stats, and the host sampler's CPU."""

    run_dir: str
    scenario: str
    batch_size: int
    task_cpu_s_per_sample: float  # each operator's cpu_s over the rows it produced, summed (Ray's own figures)
    handoff_s_per_batch: float  # (user thread blocked - blocked on production) / batches (Ray's own timers)
    host_cpu_s_per_sample: float  # the training process and its children (Ray's processes) per sample (sampler)
    task_wall_s_per_sample: float = math.nan  # each operator's wall_s over its rows, summed (Ray's own; NaN: none)
    workers: TaskWorkers | None = None  # the task workers' loop threads on this host (host sampler; None: not read)
    long_step: str = ""  # the run's longest measured step, in words, where it is an event (long_step); else ""
    cpus: int = 0  # the run's Ray CPUs (its --workers)

    @property
    def wall_per_cpu(self) -> float:
        """How much longer a task held its Ray CPU than it computed (its wall seconds over its CPU seconds, at least
        1; 1 where Ray gave no wall time): a task waiting for a core, for its input blocks, for the GIL still holds
        its CPU slot, and the next task waits for it."""
        if math.isnan(self.task_wall_s_per_sample) or self.task_cpu_s_per_sample <= 0:
            return 1.0
        return max(1.0, self.task_wall_s_per_sample / self.task_cpu_s_per_sample)


@dataclass(frozen=True, slots=True)
class TaskWorkers:
    """What the ray run's task workers did per batch on this host: the loop threads (where a Ray worker runs its
    tasks) of its ``cpus`` worker processes with the most CPU, from the host sampler (schedstat: on a CPU, waiting
    for one; the rest of the wall time off a CPU). Per batch of the run, summed over those workers."""

    cpus: int  # the ray run's Ray CPUs
    cpu_s: float  # on a CPU: the tasks (Ray's cpu_s) and their framing (a task's start, its blocks' put)
    runq_s: float  # waiting for a core: the host's cores shared with the trainer, Ray's processes, the rest
    idle_s: float  # off a CPU and not waiting for one: between tasks (NaN: the run's loop did not wait for data)
    rest_cores: float  # what the rest of the host ran meanwhile, in cores (the host's CPU less these workers')
    usable_cores: int

    @property
    def stretch(self) -> float:
        """How much longer the loop threads held a batch than they computed it: (on a CPU + waiting) / on a CPU."""
        return 1.0 + self.runq_s / self.cpu_s if self.cpu_s > 0 else 1.0

    def to_dict(self) -> dict[str, object]:
        return {
            "ray_cpus": self.cpus,
            "cpu_seconds_per_batch": self.cpu_s,
            "runq_seconds_per_batch": self.runq_s,
            "idle_seconds_per_batch": None if math.isnan(self.idle_s) else self.idle_s,
            "rest_of_host_cores": self.rest_cores,
            "usable_cores": self.usable_cores,
        }


def task_workers(
    processes: Sequence[tuple[float, float]],
    cpus: int,
    step_s: float,
    *,
    host_cores: float,
    usable_cores: int,
    waited: bool,
) -> TaskWorkers | None:
    """The ray run's task workers from its loader processes' loop threads (``processes``: each worker process's
    (% on a CPU, % waiting for one) of wall time), ``cpus`` Ray CPUs, a step every ``step_s``; ``host_cores``: the
    cores the whole host ran meanwhile; ``waited``: its loop waited for data (the idle is the loader's own then, not
    the loop's slowness). None with fewer processes than CPUs."""
    top = sorted(processes, key=lambda p: -p[0])[:cpus]
    if cpus < 1 or len(top) < cpus or step_s <= 0:
        return None
    # each of the N workers makes 1/N of the batches and holds each for N steps: per batch, their shares add up
    on, runq = (math.fsum(p[i] for p in top) / 100 * step_s for i in (0, 1))
    idle = math.fsum(max(0.0, 100 - p[0] - p[1]) for p in top) / 100 * step_s if waited else math.nan
    rest = max(0.0, host_cores - math.fsum(p[0] for p in top) / 100)
    return TaskWorkers(cpus, on, runq, idle, rest, usable_cores)


def long_step(step_ms: Sequence[float]) -> str:
    """A sentence naming a run's longest measured step where it is ``LONG_STEP`` times their median or more, else
    "": every per-batch figure of the run (its CPU over its mean step) carries that step's work."""
    if len(step_ms) < 3:
        return ""
    med = statistics.median(step_ms)
    i = max(range(len(step_ms)), key=step_ms.__getitem__)
    if not med > 0 or step_ms[i] < LONG_STEP * med:
        return ""
    return (
        f"the ray run's measured step {i + 1} of {len(step_ms)} took {step_ms[i]:.0f} ms, {step_ms[i] / med:.0f}x "
        f"their median ({step_ms[i] / math.fsum(step_ms):.0%} of their time): its per-batch figures carry that "
        "step's work (the ray rows are lower for it); a longer --ray-run dilutes it"
    )


def ray_figures(
    run_dir: str,
    scenario: str,
    batch_size: int,
    stats: dict[str, object],
    host_cpu_s: float,
    *,
    workers: TaskWorkers | None = None,
    step_ms: Sequence[float] = (),
    cpus: int = 0,
) -> RayFigures:
    """``stats``: a ray run's ``ray_stats`` (pipelines.ray_stats.read_stats); ValueError naming what is missing."""
    ops = [o for o in stats.get("operators") or [] if isinstance(o, dict)]  # type: ignore[attr-defined]
    if not ops:
        raise ValueError("its ray_stats has no operators")
    # each operator's CPU per row it produced: operators need not have made the same rows (the run takes part of an
    # epoch; a read Ray reports apart from the map, as ray.data.from_numpy's was, made them all at once), so each is
    # put per row before they are summed. The pipeline's lazy read is fused with its map: one operator today
    per_row = [float(o.get("cpu_s") or 0.0) / float(o["rows"]) for o in ops if (o.get("rows") or 0) > 0]
    batches = stats.get("batches")
    blocked, production = stats.get("user_thread_blocked_s"), stats.get("blocked_on_production_s")
    if len(per_row) < len(ops) or not isinstance(batches, int) or batches < 1:
        raise ValueError("its ray_stats counted no rows or batches")
    if not isinstance(blocked, int | float) or not isinstance(production, int | float):
        raise ValueError("its ray_stats has no iteration timers")
    handoff = max(0.0, float(blocked) - float(production)) / batches
    # each operator's wall seconds per row it produced, as its CPU (every operator has rows by now); NaN without
    timed = all(isinstance(o.get("wall_s"), int | float) for o in ops)
    wall = math.fsum(float(o["wall_s"]) / float(o["rows"]) for o in ops) if timed else math.nan
    return RayFigures(
        run_dir, scenario, batch_size, math.fsum(per_row), handoff, host_cpu_s, wall, workers, long_step(step_ms), cpus
    )


@dataclass(frozen=True, slots=True)
class RayCost:
    """Per sample on a Ray CPU (the loader's and Ray's), per batch on the trainer, and the host's share."""

    loader_cpu_s: float  # the base's loader CPU per sample (plus its storage wait)
    overhead_s: float  # Ray's map tasks' cost per sample beyond it (0: not measured)
    handoff_s: float  # the trainer's hand-off per batch at ``handoff_batch`` samples (0: not measured)
    handoff_batch: int
    outside_s: float  # host CPU per sample outside the map tasks in a ray run (NaN: not measured)
    source: str  # the ray run the overhead came from, or why it is not included
    wall_per_cpu: float = 1.0  # the ray run's tasks' wall seconds over their CPU seconds (RayFigures.wall_per_cpu)
    # the ray run's task workers on this host (None: not read): what holds a Ray CPU besides the tasks' own CPU
    workers: TaskWorkers | None = None
    framing_s: float = 0.0  # per sample: a worker's CPU beyond Ray's cpu_s of its tasks (a task's start, the put)
    idle_s: float = 0.0  # per batch: a worker off a CPU between its tasks while the loop waited for data
    long_step: str = ""  # the ray run's event step, in words (RayFigures.long_step)
    cpus: int = 0  # the ray run's Ray CPUs (0: no ray run)
    # the ray run's own 95% relative half-width of its mean step (its steps' spread, as the base's: 0 for the base
    # itself, whose spread every row's interval has already): a ray row's interval adds it
    half_width: float = 0.0

    def stretch(self, n: int) -> float:
        """How long a local Ray CPU holds a batch per CPU second of it with ``n`` CPUs on this host: the ray run's
        task workers' own (on a CPU + waiting for one, over on a CPU) at its CPU count, and at another count that
        times the change in the cores' fair share, ESTIMATED: ``n`` busy workers beside what the rest of the host
        ran in the ray run (the trainer, Ray's processes, other processes), over the usable cores."""
        w = self.workers
        if w is None:
            return self.wall_per_cpu

        def share(k: int) -> float:
            return max(1.0, (k + w.rest_cores) / max(1, w.usable_cores))

        return w.stretch * share(n) / share(w.cpus)

    @property
    def measured(self) -> bool:
        return not math.isnan(self.outside_s)

    @property
    def task_s(self) -> float:
        """One sample's seconds on a Ray CPU."""
        return self.loader_cpu_s + self.overhead_s

    def scaled(self, k: float) -> RayCost:
        """Every measured cost times ``k`` (the interval's)."""
        return replace(
            self,
            loader_cpu_s=self.loader_cpu_s * k,
            overhead_s=self.overhead_s * k,
            handoff_s=self.handoff_s * k,
            outside_s=self.outside_s * k,
            framing_s=self.framing_s * k,
            idle_s=self.idle_s * k,
        )

    def line(self) -> str:
        """Where the Ray figures come from, in words."""
        head = f"the loader's CPU {self.loader_cpu_s * 1e3:.3g} ms/sample (MEASURED in the base run)"
        if not self.measured:
            return f"{head}; Ray's own per-batch cost NOT INCLUDED ({self.source})"
        return (
            f"{head} + Ray's map-task overhead {self.overhead_s * 1e3:.3g} ms/sample, the trainer's hand-off "
            f"{self.handoff_s * 1e3:.3g} ms/batch of {self.handoff_batch} and {self.outside_s * 1e3:.3g} ms/sample of "
            f"host CPU outside the tasks (MEASURED from {self.source}: Ray's own stats and the host sampler)"
            + (
                f"; a Ray CPU also holds a batch for its worker's {self.framing_s * 1e3:.3g} ms/sample of CPU beyond "
                f"the tasks' and {self.idle_s * 1e3:.3g} ms/batch between tasks (MEASURED: the ray run's task "
                "workers, host sampler)"
                if self.workers is not None
                else ""
            )
        )

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "loader_cpu_seconds_per_sample": self.loader_cpu_s,
            "ray_overhead_seconds_per_sample": self.overhead_s if self.measured else None,
            "handoff_seconds_per_batch": self.handoff_s if self.measured else None,
            "handoff_batch_size": self.handoff_batch,
            "host_cpu_outside_tasks_seconds_per_sample": num(self.outside_s),
            "task_wall_per_cpu": self.wall_per_cpu,
            "worker_framing_seconds_per_sample": self.framing_s if self.workers is not None else None,
            "worker_idle_seconds_per_batch": self.idle_s if self.workers is not None else None,
            "task_workers": self.workers.to_dict() if self.workers is not None else None,
            "ray_run_cpus": self.cpus or None,
            "ray_run_half_width": None if math.isinf(self.half_width) else self.half_width,
            "overhead_included": self.measured,
            "source": self.source,
        }


def ray_cost(run: MeasuredRun, cost: LoaderCost, figures: RayFigures | None, why_not: str = "") -> RayCost:
    """The Ray cost of the base ``run`` (whose loader ``cost`` is measured) with Ray's own figures from ``figures``
    (the base's own when it ran on ray). ``why_not``: why no ray run was given."""
    storage = 0.0 if math.isnan(run.storage_s_per_sample) else run.storage_s_per_sample
    if figures is None:
        return RayCost(cost.cpu_s + storage, 0.0, 0.0, run.batch_size, math.nan, why_not or "no ray run")
    if run.pipeline == RAY:  # the base is the ray run: its tasks' cost is the loader's and Ray's together
        loader, overhead = figures.task_cpu_s_per_sample, 0.0
    else:
        loader = cost.cpu_s + storage
        overhead = max(0.0, figures.task_cpu_s_per_sample - cost.cpu_s)
    outside = max(0.0, figures.host_cpu_s_per_sample - figures.task_cpu_s_per_sample)
    where = "the base run itself" if run.pipeline == RAY else f"ray run {figures.run_dir}"
    w = figures.workers
    framing = idle = 0.0
    if w is not None:
        framing = max(0.0, w.cpu_s / figures.batch_size - figures.task_cpu_s_per_sample)
        idle = 0.0 if math.isnan(w.idle_s) else w.idle_s
    return RayCost(
        loader,
        overhead,
        figures.handoff_s_per_batch,
        figures.batch_size,
        outside,
        where,
        figures.wall_per_cpu,
        w,
        framing,
        idle,
        figures.long_step,
        figures.cpus,
    )


def ray_cost_at(costs: Sequence[RayCost], n: int) -> RayCost:
    """The Ray cost a prediction at ``n`` Ray CPUs takes: that of the ray run of ``n`` CPUs where one was given, else
    of the nearest count (the fewer on a tie). A run's idle between tasks and its workers' wait for a core are what
    it measured at its own count: at another count the wait is scaled by the cores' fair share (ESTIMATED), and the
    idle, which a run of fewer CPUs cannot show (two local CPUs idled 17-31 ms a batch where one idled 0-2 ms:
    docs/whatif.md), is carried over as measured."""
    if not costs:
        raise ValueError("no Ray cost")
    return min(costs, key=lambda c: (abs(c.cpus - n), c.cpus))


def predict_ray(rc: RayCost, host: Host, t: Target, *, local: bool = False) -> Prediction:
    """``t`` (pipeline ray, ``t.workers`` Ray CPUs) in the steady state: the tasks' period beside the trainer's
    step (the pageable copy blocks as in naive with workers); ``local``: also bound by the host's free cores."""
    if not t.fits:
        return Prediction(t, "OOM")
    b, n = t.batch_size, max(1, t.workers)
    batch_cpu = b * rc.task_s
    handoff = rc.handoff_s * b / rc.handoff_batch if rc.handoff_batch else 0.0
    # a Ray CPU holds a batch for its tasks' CPU, its worker's framing and its idle between tasks; on this host
    # (local) its CPU seconds stretch as the ray run's workers' did waiting for this host's cores (without the
    # workers' readings, as its tasks' wall time over their CPU); a remote CPU holds it for its CPU time
    held = batch_cpu + b * rc.framing_s
    loader = (held * (rc.stretch(n) if local else 1.0) + rc.idle_s) / n
    launch = host.overhead_s + t.launch_s + handoff
    dev = max(t.device_s, t.launch_s)
    fed = t.h2d_s + max(launch, dev)
    period = max(loader, fed)
    parts = {"loader": loader, "device": t.device_s, "launch": launch, "host link": t.h2d_s}
    # what stays on this host (the trainer, Ray's driver threads, this node's raylet) shares its free cores, and
    # on this host (local) the tasks too
    here = b * (0.0 if math.isnan(rc.outside_s) else rc.outside_s) + (batch_cpu if local else 0.0)
    if here > 0:
        parts["cores"] = here / host.free_cores
        period = max(period, parts["cores"])
    binding = max(parts, key=lambda k: parts[k])
    cpus = max(1, math.ceil((held + rc.idle_s) / fed - 1e-9)) if fed > 0 else None
    return steady(t, period, dev, parts, binding=binding, workers_needed=cpus, cores_needed=cpus)


def ray_lines(costs: Sequence[RayCost], host: Host, predictions: Sequence[Prediction], check: bool) -> list[str]:
    """What the ray predictions are made of and what their CPUs share, in words (the header's lines); ``costs``: one
    per ray run given (:func:`ray_cost_at` picks a prediction's)."""
    head = "Ray Data on N CPUs (--ray-cpus), PREDICTED from"
    if len(costs) == 1:
        out = [f"{head} {costs[0].line()}"]
    else:
        out = [f"{head} the ray run of N CPUs (else of the nearest count):"]
        out += [f"  at {rc.cpus} CPU{'s' if rc.cpus != 1 else ''}: {rc.line()}" for rc in costs]
    out += [rc.long_step for rc in costs if rc.long_step]
    if spreads := [rc for rc in costs if rc.measured and rc.half_width > 0]:
        out.append(
            "a ray row's interval adds its ray run's own spread ("
            + ", ".join(
                f"{rc.cpus} CPU{'s' if rc.cpus != 1 else ''}: "
                + ("too few steps" if math.isinf(rc.half_width) else f"+/-{rc.half_width:.1%} at 95%")
                for rc in spreads
            )
            + ", from its steps as the base's): the prediction rests on both runs"
        )
    asked = sorted({max(1, p.target.workers) for p in predictions if p.target.pipeline == RAY})
    have = {rc.cpus for rc in costs if rc.measured and rc.cpus}
    if have and (others := [n for n in asked if n not in have]):
        out.append(
            f"at {', '.join(map(str, others))} CPUs no ray run of that count was given: Ray's figures are the "
            "nearest count's, and its workers' idle between tasks is carried over as measured there (a run of "
            "fewer CPUs cannot show how often Ray Data leaves a CPU without a task), ESTIMATED"
        )
    if not check:
        out.append(
            "the N CPUs are remote, of this host's speed: the tasks do not share this host's cores with the trainer "
            "(as --workers N's processes do); the trainer's step gains Ray's hand-off, and what stays here (the host "
            "CPU outside the tasks) shares this host's free cores"
        )
        return out
    out.append(_local_line(costs, host))
    if cannot := _cannot_stand_in(costs, host, predictions):
        out.append(
            "this host cannot stand in for a cluster of N = "
            + ", ".join(cannot)
            + " CPUs with the trainer beside them: those checks measure this host, not N remote CPUs"
        )
    return out


def _local_line(costs: Sequence[RayCost], host: Host) -> str:
    """What a local Ray CPU holds a batch for, as --check measures it on this host."""
    holds = [
        f"a Ray CPU holds a batch x{rc.workers.stretch:.3g} its CPU time, as the ray run's {rc.workers.cpus} task "
        "worker(s) did waiting for a core, MEASURED by the host sampler"
        if rc.workers is not None
        else f"a task holds its Ray CPU x{rc.wall_per_cpu:.3g} its CPU time, as the ray run's tasks did, "
        "MEASURED by Ray"
        for rc in costs
    ]
    scaled = any(rc.workers is not None for rc in costs)
    return (
        f"--check runs --pipeline ray on a local Ray instance of N CPUs on THIS host: its tasks share the base run's "
        f"{host.free_cores:.2g} free of {host.usable_cores} cores with the trainer, so the ray rows are PREDICTED for "
        f"this host (bound 'cores': every CPU second of a batch over the free cores; {'; '.join(holds)}"
        + (", and at other CPU counts that times the change in the cores' fair share, ESTIMATED" if scaled else "")
        + ") and each row's prediction for N remote CPUs is predicted_remote_throughput_samples_per_s in the JSON"
    )


def _cannot_stand_in(costs: Sequence[RayCost], host: Host, predictions: Sequence[Prediction]) -> list[str]:
    """The checked CPU counts whose tasks and trainer need more than the base's free cores, in words."""
    cannot = []
    for p in predictions:
        if p.target.pipeline != RAY or p.status != "ok" or math.isnan(p.remote_samples_per_s):
            continue
        n = max(1, p.target.workers)
        outside = ray_cost_at(costs, n).outside_s
        trainer = (0.0 if math.isnan(outside) else outside) * p.remote_samples_per_s  # the trainer, Ray's processes
        if n + trainer > host.free_cores:
            cannot.append(f"{n} ({n + trainer:.2g} cores)")
    return cannot
