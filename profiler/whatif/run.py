"""``stallscope whatif``'s work: the measured run read back (``source``), each target's step counted on the meta
device, the pure model's predictions (``model``) and, asked for, their check runs (``check``). Nothing here
renders; progress lines go to the caller's ``note``."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from profiler.whatif.check import CheckPlan, check_all
from profiler.whatif.model import (
    AS_MEASURED,
    NO_GAP,
    Storage,
    WhatIf,
    WhatIfError,
    host_of,
    loader_cost,
    loader_place,
    on_host,
    predict,
)
from profiler.whatif.source import (
    Note,
    StepCosts,
    default_devices,
    measure_gap,
    needs_gap,
    notes,
    read_run,
    resolve_devices,
)


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
    check: bool = False
    plan: CheckPlan = field(default_factory=CheckPlan)


@dataclass(frozen=True, slots=True)
class Outcome:
    result: WhatIf
    check_failed: bool = False  # a check run failed for another reason than a predicted OOM


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
    gap = NO_GAP
    if needs_gap(m, targets):
        gap = measure_gap(src, note) if req.worker_gap == "measure" else replace(NO_GAP, source="--worker-gap off")
        cost = loader_cost(m, gap)
        gap = on_host(gap, host)
    measured_at = loader_place(m.pipeline, m.workers)
    stored = req.storage.cost(cost, m)
    predictions = [
        predict(stored, host, t, gap, measured_at, store_s=req.storage.period(t.batch_size, m)) for t in targets
    ]
    result = WhatIf(
        str(src.run_dir), m, cost, host, tuple(predictions), notes=tuple(notes(src)), gap=gap, storage=req.storage
    )
    if not req.check:
        return Outcome(result)
    checked, failed = check_all(src, predictions, devices, plan, note)
    return Outcome(replace(result, checked=tuple(checked), repeat=plan.repeat), failed)
