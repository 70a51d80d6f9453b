"""What ``whatif`` reads of a measured run: its record and Summary (read back once), the model's inputs, its
scenario rebuilt, the targets' step costs counted on the meta device and the worker gap measured on its dataset.
The one module of the package that reads a run store back. Every failure a user can fix is a one-line
:class:`~profiler.whatif.model.WhatIfError`."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.whatif.model import NO_GAP, WORKER, LoaderGap, MeasuredRun, Target, WhatIfError, loader_place

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.steps.device_timers import DeviceInfo
    from profiler.sim.cost import StepCost
    from profiler.sim.specs import SimConfig
    from profiler.whatif.ray import RayFigures
    from scenarios import Scenario

# A progress or status line for the user (the CLI prints it on stderr)
Note = Callable[[str], None]

DEFAULT_TARGETS = ("sim:v100", "sim:h100")


@dataclass(frozen=True, slots=True)
class Source:
    """The measured run: its meta and Summary, the model's inputs, its scenario and data directory."""

    run_dir: Path
    meta: dict[str, Any]  # the store's run meta (JSON)
    summary: Summary
    measured: MeasuredRun
    scenario: Scenario
    data_root: Path | None
    step_ms: tuple[float, ...] = ()  # each measured step's wall time, in order (whatif.confidence's spread)


def read_summary(run_dir: str | Path) -> Summary:
    """The Summary of the run stored in ``run_dir`` (StoreError when there is none)."""
    from profiler.analysis import summarize
    from profiler.core.store import load_run

    return summarize(load_run(run_dir))


def read_run(run_dir: str) -> Source:
    """The run, read back once; WhatIfError when it is not a run, has no measured steps, or its scenario is gone."""
    from profiler.analysis import summarize
    from profiler.core.store import StoreError, load_run

    try:
        rec = load_run(run_dir)
    except StoreError as exc:
        raise WhatIfError(str(exc)) from None
    summary = summarize(rec)
    meta = rec.meta
    if summary.mode != "instrumented":
        raise WhatIfError(
            f"{run_dir} is a run of a command ({summary.mode}): whatif needs a scenario it can re-run "
            "(stallscope run SCENARIO)"
        )
    if summary.steps < 1 or not summary.throughput_samples_per_s > 0:
        raise WhatIfError(f"{run_dir} has no measured steps: whatif needs a run that measured at least one step")
    if not isinstance(meta.get("batch_bytes"), int):
        raise WhatIfError(f"{run_dir} did not record batch_bytes (a run from an older stallscope): run it again")
    data_root = Path(meta["data_root"]) if meta.get("data_root") else None
    scenario = _scenario(meta, run_dir)
    count = meta.get("synthetic_images")
    if data_root is not None and not data_root.is_dir() and isinstance(count, int) and scenario.data is not None:
        from scenarios.datagen import temporary  # a --synthetic-input run's batch: its directory went at its exit

        data_root = temporary(str(scenario.data), count)
    from profiler.analysis.apart import measured_steps

    step_ms = tuple((st.t_end - st.t_start) * 1e3 for st in measured_steps(rec))
    return Source(Path(run_dir), meta, summary, _measured(summary, meta), scenario, data_root, step_ms)


def _measured(summary: Summary, meta: dict[str, Any]) -> MeasuredRun:
    import pipelines

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
        storage_s_per_sample=storage_wait(summary),
        read_bytes_per_sample=read_bytes(summary),
    )


def storage_wait(summary: Summary) -> float:
    """Seconds per sample the loader processes waited for storage: an emulated store's measured waits per item,
    plus the time they were blocked in reads from storage (loader time: their share x the measured window)."""
    wait = 0.0
    stages = summary.stages
    if stages is not None and stages.store_wait_ms_per_item is not None:
        wait += stages.store_wait_ms_per_item / 1e3
    lt = summary.loader_time
    samples = summary.samples_measured or 0
    if lt is not None and samples > 0 and summary.measured_s > 0:
        loaders = [p for p in lt.processes if p.label != "main"] or list(lt.processes[:1])
        blocked = math.fsum(p.storage for p in loaders if not math.isnan(p.storage)) / 100
        wait += blocked * summary.measured_s / samples
    return wait


def read_bytes(summary: Summary) -> float:
    """Bytes a sample reads: an emulated store's count per item, else the loader processes' read calls (rchar:
    files, sockets and pipes) per sample trained; NaN when neither was measured."""
    stages = summary.stages
    if stages is not None and stages.bytes_per_item is not None:
        return stages.bytes_per_item
    reads = summary.loader_time.reads if summary.loader_time is not None else None
    if reads is not None and summary.throughput_samples_per_s > 0:
        return reads.read_mbps * 1e6 / summary.throughput_samples_per_s
    return math.nan


def _scenario(meta: dict[str, Any], run_dir: str) -> Scenario:
    """The run's scenario: its file (``scenario_source``), else the built-in of its name."""
    import scenarios

    name = meta.get("scenario_source") or meta.get("scenario") or ""
    try:
        return scenarios.get(str(name))
    except ValueError as exc:
        raise WhatIfError(f"{run_dir}: its scenario cannot be rebuilt ({exc})") from None


def resolve_devices(names: Sequence[str]) -> list[DeviceInfo]:
    """The simulated devices named (WhatIfError naming a bad one, or one that is not simulated)."""
    from profiler.core.steps.device_timers import DeviceError, resolve_device

    devices = []
    for name in names:
        if not name.startswith("sim:"):
            raise WhatIfError(f"--device {name!r}: whatif predicts simulated devices only: allowed sim:NAME[,...]")
        try:
            devices.append(resolve_device(name))
        except DeviceError as exc:
            raise WhatIfError(str(exc)) from None
    return devices


def own_device(src: Source) -> str | None:
    """The run's own simulated device as a ``sim:`` string (None: the run is not on a simulated device)."""
    own = src.meta.get("device") or {}
    if own.get("kind") != "sim":
        return None
    sim = own["sim"]
    given = sim.get("efficiency_source") == "given"
    return f"sim:{sim['accelerator']},precision={sim['precision']}" + (
        f",efficiency={sim['efficiency']:g}" if given else ""
    )


def default_devices(src: Source, note: Note) -> list[DeviceInfo]:
    """Without --device: the run's own simulated device, else the defaults (said through ``note``)."""
    own = src.meta.get("device") or {}
    name = own_device(src)
    if name is not None:
        names = [name]
        note(f"--device: the run's own, {names[0]}")
    else:
        names = list(DEFAULT_TARGETS)
        note(f"--device: the run is on {own.get('kind', '?')}; predicting the defaults {', '.join(names)}")
    return resolve_devices(names)


def short_label(config: SimConfig) -> str:
    """``sim:v100``, with the precision and efficiency only where they are not the defaults."""
    out = f"sim:{config.spec.name}"
    if config.precision != config.spec.default_precision():
        out += f",precision={config.precision}"
    return out + (f",efficiency={config.efficiency:g}" if config.efficiency_given else "")


class StepCosts:
    """StepCost per (precision, batch size), counted once on the meta device from one item of the dataset."""

    def __init__(self, src: Source) -> None:
        self.src = src
        self._sample: Sequence[object] | None = None  # one item of the dataset: whatever the scenario's dataset yields
        self._costs: dict[tuple[str, int], StepCost] = {}

    def sample(self) -> Sequence[object]:
        if self._sample is None:
            from scenarios import DataOptions

            sc, root = self.src.scenario, self.src.data_root
            options = None if root is None else DataOptions(root=root, on_bad_sample="skip", device_type="cuda")
            try:
                self._sample = sc.build_dataset(options)[0]
            except (OSError, ValueError) as exc:
                raise WhatIfError(f"{self.src.run_dir}: its data cannot be read back ({exc})") from None
        return self._sample

    def cost(self, precision: str, batch_size: int) -> StepCost:
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
                raise WhatIfError(str(exc)) from None
        return self._costs[key]

    def target(
        self, device: DeviceInfo, pipeline: str, workers: int, batch_size: int, bytes_per_sample: float
    ) -> Target:
        import pipelines
        from profiler.sim.device import SimDevice

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


def needs_gap(m: MeasuredRun, targets: Sequence[Target]) -> bool:
    """Whether a prediction moves the loading between the main process and workers, or changes how many worker
    processes (more than one) load together: then the gap and the cores' scaling are measured. A ray target
    needs neither: Ray's own cost beyond the base's loader is measured from a ray run (profiler.whatif.ray)."""
    src_place = loader_place(m.pipeline, m.workers)
    for t in targets:
        if not t.fits or t.pipeline == "ray":
            continue
        place = loader_place(t.pipeline, t.workers)
        if place != src_place or (place == WORKER and t.workers != m.workers and max(t.workers, m.workers) > 1):
            return True
    return False


GAP_FILE = "loader-gap.json"  # in RUN_DIR/whatif/: the last measurement of the run's worker vs main-process cost
GAP_REUSE_S = 3600.0  # reused for this long on the same host, the same batch size, threads and usable cores


def measure_gap(src: Source, note: Note) -> LoaderGap:
    """The worker vs main-process cost of the run's dataset (profiler.whatif.loadergap), or 1 with the reason.
    A measurement of the same run, batch size, thread count and usable cores on this host within GAP_REUSE_S
    is reused, saying so (``RUN_DIR/whatif/loader-gap.json``; delete it to measure again)."""
    from pipelines.base import usable_cores
    from profiler.whatif.loadergap import DEFAULT_SAMPLES

    threads = src.meta.get("torch_threads")
    key = {
        "host": os.uname().nodename, "batch_size": src.measured.batch_size, "threads": threads,
        "usable_cores": usable_cores(), "samples": DEFAULT_SAMPLES,
    }  # fmt: skip
    path = src.run_dir / "whatif" / GAP_FILE
    kept = kept_gap(path, key)
    if kept is not None:
        gap, age = kept
        note(
            f"the worker vs main-process loading cost measured {age:.0f} s ago is reused ({path}; delete it to "
            "measure again)"
        )
        return replace(gap, source=f"{gap.source}; measured {age:.0f} s ago, reused")
    gap = _measure_gap(src, note, threads)
    if gap.samples:
        with suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"key": key, "at": time.time(), "gap": asdict(gap)}) + "\n")
    return gap


def kept_gap(path: Path, key: dict[str, object]) -> tuple[LoaderGap, float] | None:
    """The kept measurement and its age in seconds, when it was made for ``key`` within GAP_REUSE_S."""
    try:
        doc = json.loads(path.read_text())
        age = time.time() - float(doc["at"])
        if doc["key"] != key or not 0 <= age <= GAP_REUSE_S:
            return None
        g = dict(doc["gap"])
        for name in ("rounds", "cores_rounds"):
            g[name] = tuple(g.get(name) or ())
        return LoaderGap(**g), age
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _measure_gap(src: Source, note: Note, threads: object) -> LoaderGap:
    from profiler.whatif import loadergap
    from scenarios import DataOptions

    root, m = src.data_root, src.measured
    device_type = "cpu" if m.device_kind == "cpu" else "cuda"
    options = None if root is None else DataOptions(root=root, on_bad_sample="skip", device_type=device_type)
    note(
        f"measuring the worker vs main-process loading cost: {loadergap.DEFAULT_SAMPLES} samples x "
        f"{loadergap.DEFAULT_ROUNDS} rounds (more, up to {loadergap.DEFAULT_MAX_ROUNDS} or "
        f"{loadergap.DEFAULT_MAX_S:g} s, until the medians settle) each way (main process at "
        f"{threads or 'the current'} intra-op threads), then as many workers as usable cores together"
    )
    try:
        dataset = src.scenario.build_dataset(options)
        return loadergap.measure_gap(dataset, m.batch_size, threads=threads if isinstance(threads, int) else None)
    except (OSError, ValueError, RuntimeError) as exc:
        return replace(NO_GAP, source=f"could not be measured ({exc}): assumed 1")


def notes(src: Source) -> list[str]:
    """What a reader of the predictions should know about the measured run."""
    out = []
    if src.measured.device_kind == "cpu" and src.data_root is not None:
        out.append(
            "the measured run is on the CPU: a file-backed scenario loads its CPU-sized images there, so the "
            "loader cost per sample can differ on an accelerator (measure on a sim: device to be sure)"
        )
    if src.measured.pipeline == "dali":
        out.append("dali's CPU threads are modelled as loader workers of the measured cost per sample")
    return out


def ray_of(src: Source) -> RayFigures:
    """What ``src``, a run on the ray pipeline, measured of Ray (WhatIfError naming what is missing)."""
    from profiler.analysis.verdict import HIGH
    from profiler.whatif.ray import ray_figures, task_workers

    m = src.measured
    if m.pipeline != "ray":
        raise WhatIfError(f"--ray-run {src.run_dir}: a run of the {m.pipeline} pipeline, not ray")
    stats = (src.meta.get("loader") or {}).get("ray_stats")
    host_cpu = (math.fsum(_nan0(x) for x in (m.main_cpu_pct, m.workers_cpu_pct)) / 100) * m.step_ms / 1e3
    if not isinstance(stats, dict):
        raise WhatIfError(f"{src.run_dir}: a ray run without Ray's own stats")
    if math.isnan(m.main_cpu_pct):
        raise WhatIfError(
            f"{src.run_dir}: a ray run without a host CPU reading in its measured steps ({len(src.step_ms)} steps, "
            f"{math.fsum(src.step_ms) / 1e3:.2f} s, shorter than the sampler's period): give a ray run of more --steps"
        )
    lt, s = src.summary.loader_time, src.summary
    # the workers' loop threads, where Ray runs a task; their idle is the loader's own where the loop waited for data
    workers = (
        task_workers(
            [(p.cpu, p.runq) for p in lt.processes if p.label != "main"],
            max(1, m.workers),
            m.step_ms / 1e3,
            host_cores=s.host.sys_cpu_pct / 100 * m.usable_cores,
            usable_cores=m.usable_cores,
            waited=s.stall_fraction >= HIGH,
        )
        if lt is not None and not math.isnan(s.host.sys_cpu_pct)
        else None
    )
    try:
        return ray_figures(
            str(src.run_dir),
            str(src.meta.get("scenario")),
            m.batch_size,
            stats,
            host_cpu / m.batch_size,
            workers=workers,
            step_ms=src.step_ms,
            cpus=max(1, m.workers),
        )
    except ValueError as exc:
        raise WhatIfError(f"{src.run_dir}: {exc}") from None


def _nan0(x: float) -> float:
    return 0.0 if math.isnan(x) else x
