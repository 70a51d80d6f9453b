"""``stallscope whatif RUN_DIR``: argument parsing and wiring only.

Reads a measured run back from its store (once), rebuilds its scenario to count each target's step on the meta
device (``profiler.sim.cost.measure_step``: a new batch size gets its own FLOPs and memory), hands the figures to
the pure model (``profiler.whatif.model``) and prints its predictions (``render.whatif``). ``--check`` trains each
predicted configuration for real on its simulated device, through ``drivers.runner.run_scenario`` as ``stallscope
run`` does, into ``RUN_DIR/whatif/<label>/``; a configuration already measured there is read back, not rerun.
Exit codes: 0 ok, 2 bad input, 1 when a ``--check`` run failed for another reason than a predicted OOM.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from profiler.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    MAX_BATCH,
    MAX_WORKERS,
    BadInput,
    Handler,
    bounded,
    exit_signal,
    int_list,
    say,
)
from profiler.drivers.signals import SignalStop

DEFAULT_TARGETS = ("sim:v100", "sim:h100")
MAX_REPEAT = 20
_DEVICE_START = re.compile(r"^(sim:|cpu$|cuda|auto$)")


def device_list(text: str) -> list[str]:
    """``sim:v100,precision=amp,sim:h100`` -> ["sim:v100,precision=amp", "sim:h100"]: an item that does not
    start a device is an option of the one before it."""
    out: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: allowed sim:NAME[,OPTION=V][,sim:NAME...]")
        if _DEVICE_START.match(item) or not out:
            out.append(item)
        else:
            out[-1] += f",{item}"
    return out


def add_parsers(sub: Any) -> None:
    """Register ``whatif``."""
    w = sub.add_parser(
        "whatif",
        help="predict throughput, stall and device use on other (simulated) devices, worker counts and batch "
        "sizes from one measured run",
    )
    w.add_argument("run_dir", help="a run directory (any device: cpu or sim:NAME)")
    w.add_argument(
        "--device",
        type=device_list,
        action="extend",
        metavar="sim:NAME[,...]",
        help="comma-separated simulated devices, options after each (default: the run's own if simulated, else "
        f"{','.join(DEFAULT_TARGETS)})",
    )
    w.add_argument(
        "--workers", type=int_list(0, MAX_WORKERS), metavar="W,W,...", help="worker counts (default the run's)"
    )
    w.add_argument(
        "--batch-size", type=int_list(1, MAX_BATCH), metavar="B,B,...", help="batch sizes (default the run's)"
    )
    w.add_argument(
        "--check",
        action="store_true",
        help="also train each configuration on its simulated device (the run's steps and warm-up) into "
        "RUN_DIR/whatif/<label>/ and print predicted against measured",
    )
    w.add_argument(
        "--repeat",
        type=bounded(int, 1, MAX_REPEAT, "an integer"),
        default=1,
        metavar="N",
        help="with --check: measure each configuration N times; the median throughput is the measured figure and "
        "the spread (min-max) is shown beside it (default 1)",
    )
    w.add_argument(
        "--steps",
        type=bounded(int, 1, None, "an integer"),
        metavar="N",
        help="with --check: measured steps of each check run (default the run's)",
    )
    w.add_argument(
        "--warmup",
        type=bounded(int, 0, None, "an integer"),
        metavar="N",
        help="with --check: warm-up steps of each check run (default the run's)",
    )
    w.add_argument(
        "--worker-gap",
        choices=("measure", "off"),
        default="measure",
        help="measure how much more a sample costs a worker process than the main process on the run's dataset, "
        "and how much the usable cores' worth of workers deliver together, and apply them where a prediction moves "
        "the loading between them or changes how many workers load (default); off: assume the same cost and that "
        "each worker adds a whole one",
    )
    w.add_argument("--json", action="store_true", help='print only {"predictions": [...], ...} on stdout')


@dataclass(frozen=True, slots=True)
class _Source:
    """What the command read from the run: its record and Summary, the model's inputs, its scenario."""

    run_dir: Path
    meta: dict[str, Any]
    summary: Any
    measured: Any  # profiler.whatif.model.MeasuredRun
    scenario: Any
    data_root: Path | None


def _read_run(run_dir: str) -> _Source:
    """The run, read back once; BadInput when it is not a run, has no measured steps, or its scenario is gone."""
    from profiler.analysis import summarize
    from profiler.core.store import StoreError, load_run

    try:
        rec = load_run(run_dir)
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    summary = summarize(rec)
    meta = rec.meta
    if summary.mode != "instrumented":
        raise BadInput(f"{run_dir} is a zero-code run: whatif needs a run with measured steps (stallscope run)")
    if summary.steps < 1 or not summary.throughput_samples_per_s > 0:
        raise BadInput(f"{run_dir} has no measured steps: whatif needs a run that measured at least one step")
    if not isinstance(meta.get("batch_bytes"), int):
        raise BadInput(f"{run_dir} did not record batch_bytes (a run from an older stallscope): run it again")
    data_root = Path(meta["data_root"]) if meta.get("data_root") else None
    return _Source(Path(run_dir), meta, summary, _measured(summary, meta), _scenario(meta, run_dir), data_root)


def _measured(summary: Any, meta: dict[str, Any]) -> Any:
    import pipelines
    from profiler.whatif.model import MeasuredRun

    bd = summary.breakdown_ms_per_step
    host = summary.host
    cpu = summary.contention.cpu_pct if summary.contention is not None else {}
    workers = summary.workers or 0
    return MeasuredRun(
        run_id=summary.run_id or "?",
        pipeline=summary.pipeline or "naive",
        device_kind=summary.device.kind or "cpu",
        batch_size=int(summary.batch_size or 0),
        workers=workers,
        steps=summary.steps,
        throughput=summary.throughput_samples_per_s,
        step_ms=summary.step_time_ms.mean,
        data_wait_ms=bd.data_wait,
        h2d_ms=bd.h2d,
        compute_ms=bd.compute,
        other_ms=bd.other,
        batch_bytes=int(meta["batch_bytes"]),
        main_cpu_pct=host.main_cpu_pct,
        workers_cpu_pct=host.children_cpu_pct if workers else math.nan,
        other_processes_cpu_pct=cpu.get("other processes", math.nan),
        usable_cores=pipelines.usable_cores(),
    )


def _scenario(meta: dict[str, Any], run_dir: str) -> Any:
    """The run's scenario: its file (``scenario_source``), else the built-in of its name."""
    import scenarios

    name = meta.get("scenario_source") or meta.get("scenario") or ""
    try:
        return scenarios.get(str(name))
    except ValueError as exc:
        raise BadInput(f"{run_dir}: its scenario cannot be rebuilt ({exc})") from None


def _resolve(names: Sequence[str]) -> list[Any]:
    """The simulated devices named (BadInput naming a bad one, or one that is not simulated)."""
    from profiler.core.devices import DeviceError, resolve_device

    devices = []
    for name in names:
        if not name.startswith("sim:"):
            raise BadInput(f"--device {name!r}: whatif predicts simulated devices only: allowed sim:NAME[,...]")
        try:
            devices.append(resolve_device(name))
        except DeviceError as exc:
            raise BadInput(str(exc)) from None
    return devices


def _default_targets(src: _Source) -> list[Any]:
    """Without --device: the run's own simulated device, else the defaults (said on stderr)."""
    own = src.meta.get("device") or {}
    if own.get("kind") == "sim":
        sim = own["sim"]
        given = sim.get("efficiency_source") == "given"
        names = [
            f"sim:{sim['accelerator']},precision={sim['precision']}"
            + (f",efficiency={sim['efficiency']:g}" if given else "")
        ]
        say(f"--device: the run's own, {names[0]}")
    else:
        names = list(DEFAULT_TARGETS)
        say(f"--device: the run is on {own.get('kind', '?')}; predicting the defaults {', '.join(names)}")
    return _resolve(names)


@dataclass(frozen=True, slots=True)
class CheckPlan:
    """How each configuration is checked: runs per configuration, and each run's steps and warm-up (None: the
    measured run's)."""

    repeat: int = 1
    steps: int | None = None
    warmup: int | None = None


def cmd_whatif(args: argparse.Namespace) -> int:
    from profiler.whatif.model import NO_GAP, WhatIf, WhatIfError, host_of, loader_cost, loader_place, predict

    given = _resolve(args.device) if args.device else None  # checked before the run is read
    plan = CheckPlan(repeat=args.repeat, steps=args.steps, warmup=args.warmup)
    if not args.check and (plan.repeat != 1 or plan.steps is not None or plan.warmup is not None):
        raise BadInput("--repeat, --steps and --warmup set how --check measures: add --check")
    src = _read_run(args.run_dir)
    devices = given if given is not None else _default_targets(src)
    m = src.measured
    try:
        cost = loader_cost(m)
    except WhatIfError as exc:
        raise BadInput(str(exc)) from None
    host = host_of(m)
    workers: Sequence[int] = args.workers if args.workers is not None else [m.workers]
    batches: Sequence[int] = args.batch_size if args.batch_size is not None else [m.batch_size]
    steps = _StepCosts(src)
    targets = [
        steps.target(dev, m.pipeline, w, b, m.bytes_per_sample) for dev in devices for b in batches for w in workers
    ]
    measured_at = loader_place(m.pipeline, m.workers)
    gap = NO_GAP
    if _needs_gap(m, targets):
        gap = _measure_gap(src) if args.worker_gap == "measure" else replace(NO_GAP, source="--worker-gap off")
        cost = loader_cost(m, gap)
    predictions = [predict(cost, host, t, gap, measured_at) for t in targets]
    result = WhatIf(str(src.run_dir), m, cost, host, tuple(predictions), notes=tuple(_notes(src)), gap=gap)
    code = EXIT_OK
    if args.check:
        checked, code = _check_all(src, predictions, devices, plan)
        result = replace(result, checked=tuple(checked), repeat=plan.repeat)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from profiler.render.report import make_console
        from profiler.whatif.render import render_whatif

        render_whatif(result, make_console())
    return code


def _needs_gap(m: Any, targets: Sequence[Any]) -> bool:
    """Whether a prediction moves the loading between the main process and workers, or changes how many worker
    processes (more than one) load together: then the gap and the cores' scaling are measured."""
    from profiler.whatif.model import WORKER, loader_place

    src_place = loader_place(m.pipeline, m.workers)
    for t in targets:
        if not t.fits:
            continue
        place = loader_place(t.pipeline, t.workers)
        if place != src_place or (place == WORKER and t.workers != m.workers and max(t.workers, m.workers) > 1):
            return True
    return False


def _measure_gap(src: _Source) -> Any:
    """The worker vs main-process cost of the run's dataset (profiler.whatif.loadergap), or 1 with the reason."""
    from profiler.whatif.loadergap import (
        DEFAULT_MAX_ROUNDS,
        DEFAULT_MAX_S,
        DEFAULT_ROUNDS,
        DEFAULT_SAMPLES,
        measure_gap,
    )
    from profiler.whatif.model import NO_GAP
    from scenarios import DataOptions

    root, m = src.data_root, src.measured
    device_type = "cpu" if m.device_kind == "cpu" else "cuda"
    options = None if root is None else DataOptions(root=root, on_bad_sample="skip", device_type=device_type)
    threads = src.meta.get("torch_threads")
    say(
        f"measuring the worker vs main-process loading cost: {DEFAULT_SAMPLES} samples x {DEFAULT_ROUNDS} rounds "
        f"(more, up to {DEFAULT_MAX_ROUNDS} or {DEFAULT_MAX_S:g} s, until the medians settle) each way (main "
        f"process at {threads or 'the current'} intra-op threads), then as many workers as usable cores together"
    )
    try:
        dataset = src.scenario.build_dataset(options)
        return measure_gap(dataset, m.batch_size, threads=threads if isinstance(threads, int) else None)
    except (OSError, ValueError, RuntimeError) as exc:
        return replace(NO_GAP, source=f"could not be measured ({exc}): assumed 1")


def _notes(src: _Source) -> list[str]:
    notes = []
    if src.measured.device_kind == "cpu" and src.data_root is not None:
        notes.append(
            "the measured run is on the CPU: a file-backed scenario loads its CPU-sized images there, so the "
            "loader cost per sample can differ on an accelerator (measure on a sim: device to be sure)"
        )
    if src.measured.pipeline == "dali":
        notes.append("dali's CPU threads are modelled as loader workers of the measured cost per sample")
    return notes


class _StepCosts:
    """StepCost per (precision, batch size), counted once on the meta device from one item of the dataset."""

    def __init__(self, src: _Source) -> None:
        self.src = src
        self._sample: Any = None
        self._costs: dict[tuple[str, int], Any] = {}

    def sample(self) -> Any:
        if self._sample is None:
            from scenarios import DataOptions

            sc, root = self.src.scenario, self.src.data_root
            options = None if root is None else DataOptions(root=root, on_bad_sample="skip", device_type="cuda")
            try:
                self._sample = sc.build_dataset(options)[0]
            except (OSError, ValueError) as exc:
                raise BadInput(f"{self.src.run_dir}: its data cannot be read back ({exc})") from None
        return self._sample

    def cost(self, precision: str, batch_size: int) -> Any:
        key = (precision, batch_size)
        if key not in self._costs:
            from profiler.sim.cost import CostModelError, measure_step

            sc = self.src.scenario
            try:
                self._costs[key] = measure_step(
                    sc.model_factory(self.src.meta.get("model")),
                    self.sample(),
                    batch_size,
                    precision=precision,
                    loss=sc.loss,
                    cost_forward=sc.cost_forward,
                    targets_in_forward=sc.targets_in_forward,
                )
            except CostModelError as exc:
                raise BadInput(str(exc)) from None
        return self._costs[key]

    def target(self, device: Any, pipeline: str, workers: int, batch_size: int, bytes_per_sample: float) -> Any:
        import pipelines
        from profiler.sim.device import SimDevice
        from profiler.whatif.model import Target

        sim = SimDevice(device.sim)  # its cost figures only: nothing runs on it
        cost = self.cost(sim.config.precision, batch_size)
        pinned = getattr(pipelines.get(pipeline), "accelerator_copy", "pageable") != "pageable"
        return Target(
            device=short_label(sim.config),
            pipeline=pipeline,
            workers=workers,
            batch_size=batch_size,
            device_s=sim.step_s(cost),
            launch_s=sim.launch_total_s(cost),
            h2d_s=sim.h2d_s(round(bytes_per_sample * batch_size), pinned=pinned),
            memory_bytes=sim.memory_needed(cost),
            memory_total_bytes=sim.memory_total_bytes,
        )


def short_label(config: Any) -> str:
    """``sim:v100``, with the precision and efficiency only where they are not the defaults."""
    out = f"sim:{config.spec.name}"
    if config.precision != config.spec.default_precision():
        out += f",precision={config.precision}"
    return out + (f",efficiency={config.efficiency:g}" if config.efficiency_given else "")


def check_label(p: Any, steps: int | None = None, warmup: int | None = None, rep: int = 1) -> str:
    """A configuration's directory name under RUN_DIR/whatif/: sim-v100-amp-naive-b8-w2, with
    ``-steps30-warmup5`` when the check's window is not the run's and ``-r2`` for its second run."""
    t = p.target
    device = re.sub(r"[^A-Za-z0-9.]+", "-", t.device.replace("precision=", "").replace("efficiency=", "e"))
    out = f"{device.strip('-')}-{t.pipeline}-b{t.batch_size}-w{t.workers}"
    if steps is not None or warmup is not None:
        out += f"-steps{'' if steps is None else steps}-warmup{'' if warmup is None else warmup}"
    return out + (f"-r{rep}" if rep > 1 else "")


def _check_all(src: _Source, predictions: list[Any], devices: list[Any], plan: CheckPlan) -> tuple[list[Any], int]:
    """Each prediction beside ``plan.repeat`` runs of its configuration, the repetitions interleaved (every
    configuration once, then again) so that a burst of load on the host does not fall on one configuration's
    runs alone; the exit code (1: a check failed unexpectedly)."""
    from profiler.whatif.model import Checked

    by_label = {short_label(d.sim): d for d in devices}
    results: list[list[tuple[Any, str]]] = [[] for _ in predictions]
    total = len(predictions) * plan.repeat
    for rep in range(1, plan.repeat + 1):
        for i, p in enumerate(predictions):
            out = src.run_dir / "whatif" / check_label(p, plan.steps, plan.warmup, rep)
            n = (rep - 1) * len(predictions) + i + 1
            say(f"check [{n}/{total}] {p.target.label} -> {out}")
            if rep > 1 and results[i] and results[i][0][0] is None:
                continue  # the first run failed: the others would fail the same way
            results[i].append(_measure(src, p, by_label[p.target.device], out, plan))
    checked, code = [], EXIT_OK
    for p, runs in zip(predictions, results, strict=True):
        first = str(src.run_dir / "whatif" / check_label(p, plan.steps, plan.warmup))
        good = [s for s, _ in runs if s is not None and s.steps >= 1]
        if len(good) < len(runs) or not good:
            status = next(st for s, st in runs if s is None or s.steps < 1)
            oom = p.status == "OOM" and "out of memory" in status
            if not oom:
                code = EXIT_FAILED
            checked.append(Checked(p, math.nan, math.nan, first, "OOM as predicted" if oom else status))
            continue
        checked.append(
            Checked.of_runs(
                p,
                [s.throughput_samples_per_s for s in good],
                [s.stall_fraction for s in good],
                first,
                good[0].status,
            )
        )
    return checked, code


def _measure(src: _Source, p: Any, device: Any, out: Path, plan: CheckPlan) -> tuple[Any, str]:
    """(the Summary of the configuration's run, its status or error): read back when already measured."""
    from profiler.core.store import DB_NAME
    from profiler.drivers.runner import RunConfig, RunStopped, TrainingError, run_scenario

    if (out / DB_NAME).exists():
        from profiler.analysis import summarize
        from profiler.core.store import StoreError, load_run

        try:
            summary = summarize(load_run(out))
        except StoreError as exc:
            return None, str(exc)
        if summary.status == "complete":
            say(f"  already measured: {out}")
            return summary, summary.status
        return None, f"{out} holds an {summary.status} run: remove it to measure again"
    meta, t = src.meta, p.target
    cfg = RunConfig(
        out=out,
        device=device,
        pipeline=t.pipeline,
        batch_size=t.batch_size,
        workers=t.workers,
        steps=plan.steps if plan.steps is not None else src.summary.steps,
        warmup=plan.warmup if plan.warmup is not None else src.summary.warmup_steps,
        seed=int(meta.get("seed", 0) or 0),
        data=src.data_root,
        model=meta.get("model"),
        attribution=False,
        on_bad_sample=str(meta.get("on_bad_sample", "fail")),
        extra_meta={"whatif_of": str(src.run_dir)} | _source_meta(meta),
    )
    try:
        with SignalStop():
            session = run_scenario(src.scenario, cfg)
    except TrainingError as exc:
        return None, exc.where
    except RunStopped as exc:
        say(f"stopped by {exc.signame}")
        raise SystemExit(exit_signal(exc.signame)) from None
    return session.summary(), "complete"


def _source_meta(meta: dict[str, Any]) -> dict[str, Any]:
    return {"scenario_source": meta["scenario_source"]} if meta.get("scenario_source") else {}


HANDLERS: dict[str, Handler] = {"whatif": cmd_whatif}
