"""``stallscope whatif``'s work: the measured run read back (``source``), each target's step counted on the meta
device, the pure model's predictions (``model``) and, asked for, their check runs (``check``). Nothing here
renders; progress lines go to the caller's ``note``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from profiler.whatif.check import CheckPlan, check_all
from profiler.whatif.confidence import Confidence, add_confidence, gap_half_width, interval, spread_of
from profiler.whatif.model import (
    AS_MEASURED,
    NO_GAP,
    Host,
    LoaderCost,
    LoaderGap,
    MeasuredRun,
    Prediction,
    Storage,
    Target,
    WhatIf,
    WhatIfError,
    host_of,
    loader_cost,
    loader_place,
    on_host,
    predict,
)
from profiler.whatif.ray import RAY, RayCost, predict_ray, ray_cost, ray_cost_at, ray_lines
from profiler.whatif.source import (
    Note,
    Source,
    StepCosts,
    default_devices,
    measure_gap,
    needs_gap,
    notes,
    own_device,
    ray_of,
    read_run,
    resolve_devices,
    short_label,
)

if TYPE_CHECKING:
    from profiler.core.steps.device_timers import DeviceInfo


@dataclass(frozen=True, slots=True)
class Request:
    """What to predict from the run in ``run_dir``; None: the run's own (devices: its simulated device, else
    ``source.DEFAULT_TARGETS``)."""

    run_dir: str
    devices: Sequence[str] | None = None
    workers: Sequence[int] | None = None
    batch_sizes: Sequence[int] | None = None
    worker_gap: str = "measure"  # or "off": assume a worker's cost is the main process's
    storage: Storage = AS_MEASURED  # where the bytes come from: as measured, cached, or a store of N MB/s
    host_cores: int | None = None  # the cores of the host the predictions are for (None: the run's)
    ray_cpus: Sequence[int] | None = None  # also predict the pipeline moved to Ray Data on each N CPUs
    ray_runs: Sequence[str] = ()  # runs on the ray pipeline (one per Ray CPU count) whose Ray figures they add
    check: bool = False
    plan: CheckPlan = field(default_factory=CheckPlan)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: WhatIf
    check_failed: bool = False  # a check run failed for another reason than a predicted OOM
    confidence: Confidence | None = None  # each prediction's interval and, checked, its speedup against the base

    def to_dict(self) -> dict[str, object]:
        """The JSON of ``whatif --json``: the result's, with each row's interval and speedups added."""
        out = self.result.to_dict()
        if self.confidence is not None:
            add_confidence(out, self.result, self.confidence)
        return out


@dataclass(frozen=True, slots=True)
class _Model:
    """What every prediction of one request is made from: the measured run's costs, host and gap."""

    run: MeasuredRun
    cost: LoaderCost
    host: Host
    gap: LoaderGap
    storage: Storage
    ray: tuple[RayCost, ...] = ()  # one per ray run (ray_cost_at picks a target's)
    ray_local: bool = False  # ray targets on this host's cores (what --check measures), not remote CPUs

    def predict(self, t: Target, k: float = 1.0) -> Prediction:
        """``t``'s prediction, with the run's measured loader cost and loop overhead scaled by ``k`` (1: as
        measured); the base's own configuration (storage as measured) keeps the measured storage."""
        if t.pipeline == RAY and self.ray:
            return self._ray(t, k)
        storage = t.storage if t.storage.label else AS_MEASURED
        cost = storage.cost(self.cost, self.run)
        if k != 1.0:
            cost = replace(cost, wall_s=cost.wall_s * k, cpu_s=cost.cpu_s * k)
        host = replace(self.host, overhead_s=self.host.overhead_s * k) if k != 1.0 else self.host
        at = loader_place(self.run.pipeline, self.run.workers)
        return predict(cost, host, t, self.gap, at, store_s=storage.period(t.batch_size, self.run))

    def _ray(self, t: Target, k: float) -> Prediction:
        rc = ray_cost_at(self.ray, max(1, t.workers))
        rc = rc.scaled(k) if k != 1.0 else rc
        host = replace(self.host, overhead_s=self.host.overhead_s * k) if k != 1.0 else self.host
        src = rc.source if rc.measured else ""  # no ray run: the lines say why, the row names none
        p = replace(predict_ray(rc, host, t, local=self.ray_local), ray_source=src, ray_run_cpus=rc.cpus)
        if not self.ray_local or p.status != "ok":
            return p
        return replace(p, remote_samples_per_s=predict_ray(rc, host, t).samples_per_s)


def run_whatif(req: Request, note: Note) -> Outcome:
    """The predictions (and check runs) ``req`` asks for. WhatIfError (one line) for what the user can fix;
    ``check.CheckStopped`` when a signal stopped a check run."""
    given = resolve_devices(req.devices) if req.devices else None  # checked before the run is read
    plan = req.plan
    if not req.check and (plan.repeat != 1 or plan.steps is not None or plan.warmup is not None):
        raise WhatIfError("--repeat, --steps and --warmup set how --check measures: add --check")
    if req.check and req.host_cores is not None:
        raise WhatIfError(
            f"--host-cores {req.host_cores} predicts for another host, and --check measures on this one: use one"
        )
    if req.ray_runs and not req.ray_cpus:
        raise WhatIfError("--ray-run gives Ray's cost to the --ray-cpus predictions: add --ray-cpus N")
    src = read_run(req.run_dir)
    devices = given if given is not None else default_devices(src, note)
    m = src.measured
    cost = loader_cost(m)
    host = host_of(m, req.host_cores)
    workers = req.workers if req.workers is not None else [m.workers]
    batches = req.batch_sizes if req.batch_sizes is not None else [m.batch_size]
    steps = StepCosts(src)
    if req.storage.mbps is not None and math.isnan(m.read_bytes_per_sample):
        raise WhatIfError(f"--storage-mbps: run {m.run_id} did not measure the bytes a sample reads")
    targets = [
        replace(steps.target(dev, m.pipeline, w, b, m.bytes_per_sample), storage=req.storage)
        for dev in devices
        for b in batches
        for w in workers
    ]
    ray: tuple[RayCost, ...] = ()
    if req.ray_cpus or m.pipeline == RAY:
        ray = _ray_costs(src, m, cost, req, note)
        targets += _ray_targets(
            steps, devices, batches, req.ray_cpus or [], targets, bytes_per_sample=m.bytes_per_sample
        )
    if req.check:  # the base's own configuration is re-measured beside the others: the speedups' denominator
        devices, targets = _with_base(src, steps, devices, targets, note)
    gap = NO_GAP
    if needs_gap(m, targets):
        gap = measure_gap(src, note) if req.worker_gap == "measure" else replace(NO_GAP, source="--worker-gap off")
        cost = loader_cost(m, gap)
        gap = on_host(gap, host)
    model = _Model(m, cost, host, gap, req.storage, ray, ray_local=req.check)
    predictions = [model.predict(t) for t in targets]
    result = WhatIf(
        str(src.run_dir), m, cost, host, tuple(predictions), notes=tuple(notes(src)), gap=gap, storage=req.storage
    )
    if ray:
        result = replace(result, ray=_ray_dict(ray), ray_lines=tuple(ray_lines(ray, host, predictions, req.check)))
    base = _base_index(src, targets)
    if not req.check:
        return Outcome(result, confidence=_confidence(src, model, result, base))
    checked, failed = check_all(src, predictions, devices, plan, note)
    result = replace(result, checked=tuple(checked), repeat=plan.repeat)
    return Outcome(result, failed, _confidence(src, model, result, base))


def _is_base(src: Source, t: Target) -> bool:
    m, own = src.measured, own_device(src)
    return (
        own is not None
        and t.device == _label(own)
        and (t.pipeline, t.workers, t.batch_size) == (m.pipeline, m.workers, m.batch_size)
        and not t.storage.label
    )


def _label(device: str) -> str:
    return short_label(resolve_devices([device])[0].sim)


def _base_index(src: Source, targets: Sequence[Target]) -> int | None:
    return next((i for i, t in enumerate(targets) if _is_base(src, t)), None)


def _with_base(
    src: Source, steps: StepCosts, devices: list[DeviceInfo], targets: list[Target], note: Note
) -> tuple[list[DeviceInfo], list[Target]]:
    """``devices`` and ``targets`` with the base's own configuration (its simulated device, pipeline, workers and
    batch size, storage as measured) added where it is not among them (said through ``note``). A run on another
    device than a simulated one cannot be re-measured by a check: unchanged."""
    own, m = own_device(src), src.measured
    if own is None or _base_index(src, targets) is not None:
        return devices, targets
    dev = resolve_devices([own])[0]
    base = steps.target(dev, m.pipeline, m.workers, m.batch_size, m.bytes_per_sample)
    note(f"--check: the base's own configuration ({base.label}) is re-measured beside the others")
    have = {short_label(d.sim) for d in devices}
    return ([*devices, dev] if base.device not in have else devices), [*targets, base]


def _confidence(src: Source, model: _Model, result: WhatIf, base: int | None) -> Confidence:
    """Each prediction's interval from the base's spread and, checked, the drift of its re-measured base."""
    spread = spread_of(src.step_ms)
    again = result.checked[base].measured_samples_per_s if base is not None and result.checked else math.nan
    draft = Confidence(spread, src.measured.throughput, again, (), base)
    half = draft.half_width
    intervals = tuple(_interval(model, p, half) for p in result.predictions)
    return replace(draft, intervals=intervals)


def _interval(model: _Model, p: Prediction, half: float) -> tuple[float, float]:
    """``p``'s interval: the base's half-width, plus the worker gap's where ``p`` uses it, plus its ray run's where
    it takes a ray run's figures."""
    if p.status != "ok":
        return (math.nan, math.nan)
    if p.target.pipeline == RAY and model.ray:
        half += ray_cost_at(model.ray, max(1, p.target.workers)).half_width

    def at(k: float) -> float:
        return model.predict(p.target, k).samples_per_s

    return interval(at, half + gap_half_width(model.gap, p.loader_scale != 1.0, p.target.workers))


def _ray_costs(src: Source, m: MeasuredRun, cost: LoaderCost, req: Request, note: Note) -> tuple[RayCost, ...]:
    """The Ray costs of the ray predictions, one per ray run by its Ray CPUs: Ray's figures from ``--ray-run`` (runs
    of the same scenario and batch size on the ray pipeline, one per CPU count), else from the base when it ran on
    ray, else left out, said so."""
    if not req.ray_runs and m.pipeline != RAY:
        why = "no run on the ray pipeline to measure it from: give one with --ray-run DIR"
        note(f"--ray-cpus: Ray's own per-batch cost is not included ({why})")
        return (ray_cost(m, cost, None, why),)
    others = [read_run(d) for d in req.ray_runs] or [src]
    seen: dict[int, str] = {}
    for other in others:
        if other is not src and (other.meta.get("scenario"), other.measured.batch_size) != (
            src.meta.get("scenario"),
            m.batch_size,
        ):
            raise WhatIfError(
                f"--ray-run {other.run_dir}: a run of {other.meta.get('scenario')} at batch "
                f"{other.measured.batch_size}, the base is {src.meta.get('scenario')} at batch {m.batch_size}: give a "
                "ray run of the same"
            )
        n = max(1, other.measured.workers)
        if n in seen:
            raise WhatIfError(
                f"--ray-run: {seen[n]} and {other.run_dir} both ran on {n} Ray CPU{'s' if n != 1 else ''}: give "
                "one ray run per CPU count"
            )
        seen[n] = str(other.run_dir)
    costs = (
        replace(ray_cost(m, cost, ray_of(o)), half_width=0.0 if o is src else spread_of(o.step_ms).half_width)
        for o in others
    )
    return tuple(sorted(costs, key=lambda rc: rc.cpus))


def _ray_dict(costs: tuple[RayCost, ...]) -> dict[str, object]:
    """The JSON's ``ray``: the fewest CPUs' run's figures, and with several ray runs each's under ``by_ray_run``."""
    out = costs[0].to_dict()
    return {**out, "by_ray_run": [rc.to_dict() for rc in costs]} if len(costs) > 1 else out


def _ray_targets(
    steps: StepCosts,
    devices: Sequence[DeviceInfo],
    batches: Sequence[int],
    cpus: Sequence[int],
    targets: Sequence[Target],
    *,
    bytes_per_sample: float,
) -> list[Target]:
    """A ray target per device, batch size and CPU count, less those already among ``targets`` (a ray base's)."""
    have = {(t.device, t.pipeline, t.batch_size, t.workers) for t in targets}
    out = [steps.target(dev, RAY, n, b, bytes_per_sample) for dev in devices for b in batches for n in cpus]
    return [t for t in out if (t.device, t.pipeline, t.batch_size, t.workers) not in have]
