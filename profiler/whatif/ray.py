"""What-if ``--ray-cpus N``: the run's loading moved to Ray Data ``map_batches`` tasks on N CPUs of this host's speed.
Pure: numbers in, a :class:`~profiler.whatif.model.Prediction` out.

What it takes, each measured (docs/whatif.md, "Ray Data on N CPUs"):

- the loader's CPU seconds per sample in the base run (``LoaderCost.cpu_s``; a ray base: Ray's own ``cpu_s`` per
  operator over its rows), plus its measured wait for storage, which holds a Ray CPU as it holds a worker;
- Ray's own cost, from a run on the ray pipeline (the base, or ``--ray-run``): what Ray's map tasks cost per sample
  beyond the base's loader (its block building and object-store put), the trainer's per-batch hand-off (Ray's
  "user thread blocked" time less its "blocked on production": fetching and converting a finished batch), and the
  host CPU per sample the whole ray run took outside its map tasks (the trainer's loop, Ray's driver threads,
  raylet): without such a run Ray's cost is left out, and said so.

Remote CPUs (the default) take the tasks off this host: the loader's period is their CPU per batch over N, the
trainer's step gains the hand-off, and what stays here (the host CPU outside the tasks) shares the base run's free
cores. ``local`` (what ``--check`` measures: a Ray instance of N CPUs on this host) puts the tasks' CPU on those
cores too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from profiler.whatif.model import Host, LoaderCost, MeasuredRun, Prediction, Target, steady

RAY = "ray"


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

    @property
    def wall_per_cpu(self) -> float:
        """How much longer a task held its Ray CPU than it computed (its wall seconds over its CPU seconds, at least
        1; 1 where Ray gave no wall time): a task waiting for a core, for its input blocks, for the GIL still holds
        its CPU slot, and the next task waits for it."""
        if math.isnan(self.task_wall_s_per_sample) or self.task_cpu_s_per_sample <= 0:
            return 1.0
        return max(1.0, self.task_wall_s_per_sample / self.task_cpu_s_per_sample)


def ray_figures(
    run_dir: str, scenario: str, batch_size: int, stats: dict[str, object], host_cpu_s: float
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
    return RayFigures(run_dir, scenario, batch_size, math.fsum(per_row), handoff, host_cpu_s, wall)


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
    return RayCost(
        loader, overhead, figures.handoff_s_per_batch, figures.batch_size, outside, where, figures.wall_per_cpu
    )


def predict_ray(rc: RayCost, host: Host, t: Target, *, local: bool = False) -> Prediction:
    """``t`` (pipeline ray, ``t.workers`` Ray CPUs) in the steady state: the tasks' period beside the trainer's
    step (the pageable copy blocks as in naive with workers); ``local``: also bound by the host's free cores."""
    if not t.fits:
        return Prediction(t, "OOM")
    b, n = t.batch_size, max(1, t.workers)
    batch_cpu = b * rc.task_s
    handoff = rc.handoff_s * b / rc.handoff_batch if rc.handoff_batch else 0.0
    # a task holds its Ray CPU for its wall time: on this host (local) as long as the ray run's tasks held theirs
    # per CPU second (they waited for this host's cores beside the trainer); a remote CPU for its CPU time
    loader = batch_cpu * (rc.wall_per_cpu if local else 1.0) / n
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
    cpus = max(1, math.ceil(batch_cpu / fed - 1e-9)) if fed > 0 else None
    return steady(t, period, dev, parts, binding=binding, workers_needed=cpus, cores_needed=cpus)


def ray_lines(rc: RayCost, host: Host, predictions: Sequence[Prediction], check: bool) -> list[str]:
    """What the ray predictions are made of and what their CPUs share, in words (the header's lines)."""
    out = [f"Ray Data on N CPUs (--ray-cpus), PREDICTED from {rc.line()}"]
    if not check:
        out.append(
            "the N CPUs are remote, of this host's speed: the tasks do not share this host's cores with the trainer "
            "(as --workers N's processes do); the trainer's step gains Ray's hand-off, and what stays here (the host "
            "CPU outside the tasks) shares this host's free cores"
        )
        return out
    outside = 0.0 if math.isnan(rc.outside_s) else rc.outside_s
    cannot = []
    for p in predictions:
        if p.target.pipeline != RAY or p.status != "ok" or math.isnan(p.remote_samples_per_s):
            continue
        trainer = outside * p.remote_samples_per_s  # the cores the trainer and Ray's own processes take
        if max(1, p.target.workers) + trainer > host.free_cores:
            cannot.append(f"{max(1, p.target.workers)} ({max(1, p.target.workers) + trainer:.2g} cores)")
    out.append(
        f"--check runs --pipeline ray on a local Ray instance of N CPUs on THIS host: its tasks share the base run's "
        f"{host.free_cores:.2g} free of {host.usable_cores} cores with the trainer, so the ray rows are PREDICTED for "
        "this host (bound 'cores': every CPU second of a batch over the free cores; a task holds its Ray CPU "
        f"x{rc.wall_per_cpu:.3g} its CPU time, as the ray run's tasks did, MEASURED by Ray) and each row's prediction "
        "for N remote CPUs is predicted_remote_throughput_samples_per_s in the JSON"
    )
    if cannot:
        out.append(
            "this host cannot stand in for a cluster of N = "
            + ", ".join(cannot)
            + " CPUs with the trainer beside them: those checks measure this host, not N remote CPUs"
        )
    return out
