"""What-if: the throughput, stall and device utilisation a training job would have on another (simulated) device,
worker count or batch size, predicted from one measured run. Pure: dataclasses in, dataclasses out, no I/O.

Inputs, each measured once from the run: :class:`MeasuredRun` (its Summary and meta), the loader's cost per sample
(:func:`loader_cost`), the :class:`Host`, each :class:`Target`'s step on the device and the :class:`LoaderGap`
between the main process and workers. docs/whatif.md derives the steady-state step period of each pipeline
that :func:`predict` computes from them, from profiler/sim/device.py's CUDA semantics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

# A loader-bound run: the share of the step the loop waited for data (data wait / step time) from which the
# delivery rate, not the CPU use, measures the loader (the TensorFlow "highly input-bound" band's 20%)
LOADER_BOUND = 0.20
# Workers whose summed CPU use reaches this share of the free cores were limited by the cores, not by their count
CORES_SATURATED = 0.85

NAIVE, PREFETCH, DALI = "naive", "prefetch", "dali"
# The worker gap's rounds agree within this ratio on a quiet host (ssd, imagenet: 1.0-1.35); beyond it the
# measurement is flagged as taken on a busy host
GAP_UNSTEADY = 1.5
# The most workers (or cores) a prediction says a device needs: past it the count is no longer a plan
NEEDED_MAX = 4096


class WhatIfError(ValueError):
    """A run that the model cannot use (no measured steps, no batch size); the message is one line."""


@dataclass(frozen=True, slots=True)
class MeasuredRun:
    """What the model takes from one measured run (per-step figures are means over its measured steps)."""

    run_id: str
    pipeline: str
    device_kind: str  # cpu | cuda | sim
    batch_size: int
    workers: int
    steps: int
    throughput: float  # samples/s
    step_ms: float
    data_wait_ms: float
    h2d_ms: float
    compute_ms: float
    other_ms: float
    batch_bytes: int  # what one batch moves to the device
    main_cpu_pct: float  # the training process, % of one core (NaN: not sampled)
    workers_cpu_pct: float  # all loader worker processes together, % of one core (NaN: none or not sampled)
    other_processes_cpu_pct: float  # the rest of the machine, % of one core (NaN: not sampled)
    usable_cores: int
    # the loader processes' seconds per sample waiting for storage (blocked in reads the page cache did not
    # serve, and an emulated store's waits) and the bytes a sample reads (NaN: not measured)
    storage_s_per_sample: float = 0.0
    read_bytes_per_sample: float = math.nan

    @property
    def bytes_per_sample(self) -> float:
        return self.batch_bytes / self.batch_size


@dataclass(frozen=True, slots=True)
class LoaderCost:
    """Seconds of one loader worker (or thread) per sample, and the CPU seconds within them."""

    wall_s: float  # c
    cpu_s: float  # c_cpu <= c: what the cores limit
    method: str  # which measurement gave c, in words

    def to_dict(self) -> dict[str, object]:
        return {"seconds_per_sample": self.wall_s, "cpu_seconds_per_sample": self.cpu_s, "method": self.method}


MAIN, WORKER = "main process", "worker processes"


@dataclass(frozen=True, slots=True)
class Storage:
    """Where a prediction's bytes come from: as measured (the default), all from the page cache (``cached``), or
    from a store of ``mbps`` MB/s that serves one read at a time (its reads queue behind each other)."""

    cached: bool = False
    mbps: float | None = None

    @property
    def label(self) -> str:
        if self.mbps is not None:
            return f"store {self.mbps:g} MB/s"
        return "cached" if self.cached else ""

    def cost(self, cost: LoaderCost, run: MeasuredRun) -> LoaderCost:
        """The loader's cost per sample with its storage wait replaced: none when cached; one read of the
        sample's bytes at ``mbps`` from such a store (the queueing behind other reads is :meth:`period`'s)."""
        if not (self.cached or self.mbps is not None):
            return cost
        wall = max(cost.cpu_s, cost.wall_s - run.storage_s_per_sample)
        how = f"{cost.method}, less {run.storage_s_per_sample * 1e3:.2f} ms a sample waiting for storage"
        if self.mbps is not None:
            wall += _nan0(run.read_bytes_per_sample) / (self.mbps * 1e6)
            how += f", plus {_nan0(run.read_bytes_per_sample) / 1e3:.0f} kB read at {self.mbps:g} MB/s"
        return LoaderCost(wall, cost.cpu_s, how)

    def period(self, batch: int, run: MeasuredRun) -> float:
        """Seconds the store takes to serve one batch's reads, one after another (0 without a store)."""
        if self.mbps is None:
            return 0.0
        return batch * _nan0(run.read_bytes_per_sample) / (self.mbps * 1e6)


AS_MEASURED = Storage()


def loader_place(pipeline: str, workers: int) -> str:
    """Where a configuration loads: the training process (naive without workers, the prefetch thread, DALI's
    threads) or DataLoader worker processes."""
    return WORKER if workers > 0 and pipeline != DALI else MAIN


@dataclass(frozen=True, slots=True)
class LoaderGap:
    """How much more one sample costs a DataLoader worker process than the training process, measured.

    ``factor`` = worker seconds per sample / main-process seconds per sample over the same items; 1.0 with
    ``source`` saying why when it was not measured.
    """

    factor: float
    source: str  # how it was measured (or why it is 1)
    main_s: float = math.nan  # seconds per sample loaded in the training process
    worker_s: float = math.nan  # seconds per sample delivered by one worker
    samples: int = 0  # items timed each way, over all rounds
    rounds: tuple[float, ...] = ()  # each round's ratio
    # cores_k workers at once deliver cores_k x cores_scaling times one worker's rate (1: each adds a whole one)
    cores_scaling: float = 1.0
    cores_k: int = 1  # 1: not measured
    cores_rounds: tuple[float, ...] = ()  # each round's scaling

    def parallel(self, workers: int) -> float:
        """How many single workers' rates ``workers`` worker processes deliver together: ``workers`` at the
        measured per-worker efficiency ``cores_scaling`` of ``cores_k`` workers, interpolated linearly from 1
        (one worker is itself) and held beyond ``cores_k``."""
        if workers <= 1 or self.cores_k <= 1:
            return float(max(workers, 0))
        share = min(1.0, (workers - 1) / (self.cores_k - 1))
        return workers * (1.0 - (1.0 - self.cores_scaling) * share)

    @property
    def unsteady(self) -> bool:
        """The rounds disagree by more than GAP_UNSTEADY: something else took the host's cores meanwhile."""
        return len(self.rounds) > 1 and max(self.rounds) > GAP_UNSTEADY * min(self.rounds)

    def scale(self, source_place: str, target_place: str) -> float:
        """The factor that takes a cost measured at ``source_place`` to ``target_place``."""
        if source_place == target_place or not self.factor > 0:
            return 1.0
        return self.factor if target_place == WORKER else 1.0 / self.factor

    def to_dict(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "factor": self.factor,
            "source": self.source,
            "main_process_seconds_per_sample": num(self.main_s),
            "worker_seconds_per_sample": num(self.worker_s),
            "samples": self.samples,
            "round_factors": list(self.rounds),
            "unsteady": self.unsteady,
            "cores_scaling": self.cores_scaling if self.cores_k > 1 else None,
            "cores_k": self.cores_k,
            "cores_round_scalings": list(self.cores_rounds),
        }


NO_GAP = LoaderGap(1.0, "not measured: no prediction moves the loading between the main process and workers")


def gap_from_rounds(main_s: list[float], worker_s: list[float], samples: int) -> LoaderGap:
    """The gap from interleaved rounds of timing (seconds per sample in the main process and in one worker,
    one pair per round): the ratio of the medians, so that one round hit by another process's burst does not
    set it. Each round's own ratio is kept to show the spread."""
    if not main_s or len(main_s) != len(worker_s) or min(main_s) <= 0 or min(worker_s) <= 0:
        raise ValueError("gap_from_rounds needs one positive main and worker time per round")
    m, w = statistics.median(main_s), statistics.median(worker_s)
    rounds = tuple(b / a for a, b in zip(main_s, worker_s, strict=True))
    return LoaderGap(
        w / m,
        f"measured: {samples} samples of the run's dataset loaded in the main process and in one worker, "
        f"median of {len(main_s)} interleaved rounds",
        m,
        w,
        samples,
        rounds,
    )


def median_error(values: Sequence[float]) -> float:
    """The relative standard error of the median of ``values`` (inf for fewer than 3): 1.253 sigma / sqrt(n)
    over the median, sigma estimated robustly from the median absolute deviation (x 1.4826), so that one round
    a burst hit does not inflate it as it would a standard deviation."""
    if len(values) < 3:
        return math.inf
    m = statistics.median(values)
    mad = statistics.median(abs(v - m) for v in values)
    return 1.2533 * 1.4826 * mad / math.sqrt(len(values)) / abs(m) if m else math.inf


def settled(values: Sequence[float], precision: float) -> bool:
    """The median of ``values`` is known to ``precision`` (relative standard error): more rounds would not move
    it by more than that."""
    return median_error(values) <= precision


def with_cores(gap: LoaderGap, k: int, worker_s: list[float], together_s: list[float]) -> LoaderGap:
    """``gap`` with the scaling of ``k`` workers loading together: one worker's seconds per sample over ``k``
    workers' (one pair per round), divided by ``k``, from the medians; at most 1 (k workers never beat k
    single ones: a higher reading is noise)."""
    if k < 2 or not together_s or len(together_s) != len(worker_s) or min(together_s) <= 0:
        raise ValueError("with_cores needs k >= 2 and one positive time per round each way")
    scaling = statistics.median(worker_s) / statistics.median(together_s) / k
    rounds = tuple(w / t / k for w, t in zip(worker_s, together_s, strict=True))
    return replace(gap, cores_scaling=min(1.0, scaling), cores_k=k, cores_rounds=rounds)


@dataclass(frozen=True, slots=True)
class Host:
    usable_cores: int
    other_cores: float  # cores other processes took during the measured run
    overhead_s: float  # o: the loop's own time per step (the breakdown's "other")
    given: bool = False  # the cores of the host the prediction is for (--host-cores), not the run's

    @property
    def free_cores(self) -> float:
        return max(1.0, self.usable_cores - (0.0 if math.isnan(self.other_cores) else self.other_cores))

    def to_dict(self) -> dict[str, object]:
        return {
            "usable_cores": self.usable_cores,
            "usable_cores_source": "given (--host-cores)" if self.given else "measured run",
            "other_processes_cores": None if math.isnan(self.other_cores) else self.other_cores,
            "free_cores": self.free_cores,
            "loop_overhead_ms": self.overhead_s * 1e3,
        }


@dataclass(frozen=True, slots=True)
class Target:
    """One configuration to predict: the device's figures at this batch size come from its StepCost."""

    device: str  # sim:NAME[,...]
    pipeline: str
    workers: int
    batch_size: int
    device_s: float  # D
    launch_s: float  # K
    h2d_s: float  # H: one batch's copy on this pipeline's path (pageable or pinned)
    memory_bytes: int  # the step's tensors plus the CUDA context
    memory_total_bytes: int
    storage: Storage = AS_MEASURED

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.memory_total_bytes

    @property
    def label(self) -> str:
        where = f" {self.storage.label}" if self.storage.label else ""
        return f"{self.device} {self.pipeline} b{self.batch_size} w{self.workers}{where}"


@dataclass(frozen=True, slots=True)
class Prediction:
    """The predicted steady state of one :class:`Target`; ``status`` "OOM" leaves every figure NaN."""

    target: Target
    status: str  # "ok" | "OOM"
    samples_per_s: float = math.nan
    step_ms: float = math.nan
    stall_fraction: float = math.nan
    device_utilisation: float = math.nan
    binding: str = ""  # loader | device | host link | launch
    workers_needed: int | None = None
    cores_needed: int | None = None
    parts_ms: dict[str, float] | None = None  # loader, device, launch, host link: ms per step
    loader_scale: float = 1.0  # the LoaderGap factor applied to the measured loader cost (1: same place)
    # a ray target predicted for this host's cores (what --check measures): the same on N remote CPUs
    remote_samples_per_s: float = math.nan
    ray_source: str = ""  # a ray target's: the ray run its Ray figures came from ("": none), and its Ray CPUs
    ray_run_cpus: int = 0

    def to_dict(self) -> dict[str, object]:
        t = self.target

        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "device": t.device,
            "pipeline": t.pipeline,
            "batch_size": t.batch_size,
            "workers": t.workers,
            "storage": t.storage.label or "as measured",
            "status": self.status,
            "predicted_throughput_samples_per_s": num(self.samples_per_s),
            "predicted_step_time_ms": num(self.step_ms),
            "predicted_stall_fraction": num(self.stall_fraction),
            "predicted_device_utilisation": num(self.device_utilisation),
            "binding": self.binding or None,
            "workers_needed": self.workers_needed,
            "cores_needed": self.cores_needed,
            "parts_ms_per_step": self.parts_ms,
            "loader_cost_scale": self.loader_scale,
            "memory_bytes": t.memory_bytes,
            "memory_total_bytes": t.memory_total_bytes,
            **(self._ray() if t.pipeline == "ray" else {}),
        }

    def _ray(self) -> dict[str, object]:
        local = not math.isnan(self.remote_samples_per_s)
        remote = self.remote_samples_per_s if local else self.samples_per_s
        return {
            "ray_cpus": max(1, self.target.workers),
            "ray_cpus_on": "this host (as --check measures)" if local else "remote",
            "predicted_remote_throughput_samples_per_s": None if math.isnan(remote) else remote,
            "ray_figures_from": self.ray_source or None,
            "ray_figures_cpus": self.ray_run_cpus or None,
        }


def _nan0(x: float) -> float:
    return 0.0 if math.isnan(x) else x


def loader_threads(pipeline: str, workers: int) -> int:
    """Threads or processes that load batches in parallel with the loop: 0 for naive without workers (the
    loop itself loads), the prefetch thread when prefetch has no workers, DALI's CPU threads (at least 1)."""
    if pipeline == DALI:
        return max(1, workers)
    if pipeline == PREFETCH:
        return max(1, workers)
    return workers


def loader_cost(run: MeasuredRun, gap: LoaderGap | None = None) -> LoaderCost:
    """The loader's cost per sample, from whichever of the run's measurements shows it.

    - naive with 0 workers: the loop loads each batch inside ``next()``, so the data wait per sample *is* the
      loader's wall time per sample; its CPU part is the training process's CPU per sample less the compute
      phase on a CPU device (on a simulated or CUDA device the host does not compute), at most the wall time.
    - a run with loader threads (workers, the prefetch thread, DALI threads) that was loader-bound (data wait
      >= LOADER_BOUND of the step): the loader's delivery rate is the throughput, so ``c = n_eff / throughput``,
      where ``n_eff`` is the threads, or the free cores when the threads' CPU use filled them (then the cores,
      not the count, set the rate); for worker processes, as many single workers as ``gap`` measured them to
      deliver together (:meth:`LoaderGap.parallel`). This also measures a loader that waits (I/O, a remote
      store) rather than computes, whose CPU use is near nothing.
    - a run with loader threads that was not loader-bound: the threads idled on full queues part of the time,
      so the delivery rate overstates the cost; the workers' CPU seconds per sample (host sampler) are then the
      measure: a lower bound for a loader that also waits, exact for a CPU-bound one. Without a CPU reading,
      the delivery-rate bound is used and labelled so.
    """
    if run.steps < 1 or not run.throughput > 0 or run.batch_size < 1:
        raise WhatIfError(f"run {run.run_id} has no measured steps with a known batch size: nothing to predict from")
    b, step_s, t = run.batch_size, run.step_ms / 1e3, run.throughput
    threads = loader_threads(run.pipeline, run.workers)
    main_cpu_s = _nan0(run.main_cpu_pct) / 100 * step_s / b
    if threads == 0:
        wall = run.data_wait_ms / 1e3 / b
        host_compute = run.compute_ms / 1e3 / b if run.device_kind == "cpu" else 0.0
        cpu = min(wall, max(0.0, main_cpu_s - host_compute)) if not math.isnan(run.main_cpu_pct) else wall
        return LoaderCost(wall, cpu, "naive 0-worker run: the loop's data wait per sample")
    # threads in the training process (prefetch thread, DALI) show in its CPU; worker processes in theirs
    in_process = run.workers == 0 or run.pipeline == DALI
    cpu_pct = run.main_cpu_pct if in_process else run.workers_cpu_pct
    cpu = _nan0(cpu_pct) / 100 / t if not math.isnan(cpu_pct) else math.nan
    free = max(1.0, run.usable_cores - _nan0(run.other_processes_cpu_pct) / 100)
    saturated = not math.isnan(cpu_pct) and cpu_pct / 100 >= CORES_SATURATED * min(threads, free)
    n_eff = min(float(threads), free) if saturated else float(threads)
    if not in_process and gap is not None:
        n_eff = gap.parallel(threads) * n_eff / threads
    bound_rate = n_eff / t
    loader_bound = run.data_wait_ms >= LOADER_BOUND * run.step_ms
    what = f"{threads} loader {'thread' if in_process else 'worker'}{'s' if threads != 1 else ''}"
    if loader_bound or math.isnan(cpu):
        why = "loader-bound run" if loader_bound else "no CPU reading: an upper bound"
        return LoaderCost(
            bound_rate,
            min(bound_rate, cpu) if not math.isnan(cpu) else bound_rate,
            f"{why}: delivery rate x {n_eff:.2g} effective of {what}",
        )
    return LoaderCost(cpu, cpu, f"not loader-bound: CPU seconds per sample of {what} (host sampler)")


def host_of(run: MeasuredRun, cores: int | None = None) -> Host:
    """The host of the measured run, or with ``cores`` a host of that many cores that nothing else uses (the run's
    other processes stay on the host they ran on)."""
    overhead = max(0.0, _nan0(run.other_ms)) / 1e3
    if cores is not None:
        return Host(cores, 0.0, overhead, given=True)
    return Host(run.usable_cores, run.other_processes_cpu_pct / 100, overhead)


def on_host(gap: LoaderGap, host: Host) -> LoaderGap:
    """``gap`` for predictions on ``host``: on a host of given cores, the scaling measured among this host's cores
    (where the workers shared them with the training process and whatever else ran) is not carried over; each
    worker adds a whole one up to the given cores (the loader's cost per sample is kept)."""
    if not host.given or gap.cores_k <= 1:
        return gap
    return replace(
        gap,
        cores_scaling=1.0,
        cores_k=1,
        cores_rounds=(),
        source=f"{gap.source}; the scaling of {gap.cores_k} workers on this host's cores "
        f"(x{gap.parallel(gap.cores_k):.3g}) not applied to a host of {host.usable_cores} cores",
    )


def _period(pipeline: str, threads: int, loader: float, *, dev: float, launch: float, h2d: float) -> float:
    """The step period ``P`` for the given loader period (``L`` when serial, else ``T_L``); see the module."""
    if pipeline == PREFETCH:
        return max(loader, launch, dev, h2d)
    if threads == 0:
        return h2d + max(loader + launch, dev)
    return max(loader, h2d + max(launch, dev))


def _needed(gap: LoaderGap, rate: float) -> int:
    """The fewest worker processes that deliver ``rate`` single workers' rates together (``gap``'s scaling)."""
    n = max(0, math.ceil(rate - 1e-9))
    while gap.parallel(n) < rate - 1e-9 and n < NEEDED_MAX:
        n += 1
    return n


def predict(
    cost: LoaderCost,
    host: Host,
    t: Target,
    gap: LoaderGap = NO_GAP,
    measured_at: str = MAIN,
    *,
    store_s: float = 0.0,
) -> Prediction:
    """The steady state of ``t`` (see the module docstring for the equations). ``cost`` was measured with the
    loading at ``measured_at``; ``gap`` takes it to where ``t`` loads. ``store_s``: the seconds a store that
    serves one read at a time takes for one batch's reads (:meth:`Storage.period`), a floor under the loader's."""
    if not t.fits:
        return Prediction(t, "OOM")
    b = t.batch_size
    threads = loader_threads(t.pipeline, t.workers)
    scale = gap.scale(measured_at, loader_place(t.pipeline, t.workers))
    batch_load, batch_cpu = b * cost.wall_s * scale, b * cost.cpu_s * scale
    # worker processes deliver together what ``gap`` measured, not ``threads`` times one
    eff = gap.parallel(threads) / threads if threads > 1 and loader_place(t.pipeline, t.workers) == WORKER else 1.0
    loader = batch_load if threads == 0 else max(batch_load / (threads * eff), batch_cpu / (host.free_cores * eff))
    loader = max(loader, store_s)
    launch = host.overhead_s + t.launch_s  # the host's own part of the step: loop overhead + kernel launches
    dev = max(t.device_s, t.launch_s)  # D'
    period = _period(t.pipeline, threads, loader, dev=dev, launch=launch, h2d=t.h2d_s)
    fed = _period(
        t.pipeline, max(threads, 1), 0.0, dev=dev, launch=launch, h2d=t.h2d_s
    )  # the same with an instant loader
    parts = {"loader": loader, "device": t.device_s, "launch": launch, "host link": t.h2d_s}
    if store_s > 0:
        parts["storage"] = store_s
    binding = max(parts, key=lambda k: parts[k])
    if binding == "loader" and store_s > 0 and store_s >= loader:
        binding = "storage"  # the store's serial reads set the loader's pace
    return steady(
        t,
        period,
        dev,
        parts,
        binding=binding,
        workers_needed=_needed(gap if t.pipeline != DALI else NO_GAP, batch_load / fed) if fed > 0 else None,
        cores_needed=_needed(gap if t.pipeline != DALI else NO_GAP, batch_cpu / fed) if fed > 0 else None,
        loader_scale=scale,
    )


def steady(
    t: Target,
    period: float,
    dev: float,
    parts: dict[str, float],
    *,
    binding: str,
    workers_needed: int | None,
    cores_needed: int | None,
    loader_scale: float = 1.0,
) -> Prediction:
    """The steady state of ``t`` at one step every ``period`` seconds, the device busy ``dev`` of it: the figures
    every model derives the same way from its period and its parts (seconds a step)."""
    return Prediction(
        t,
        "ok",
        samples_per_s=t.batch_size / period,
        step_ms=period * 1e3,
        stall_fraction=min(1.0, max(0.0, 1.0 - dev / period)),
        device_utilisation=min(1.0, t.device_s / period),
        binding=binding,
        workers_needed=workers_needed,
        cores_needed=cores_needed,
        parts_ms={k: v * 1e3 for k, v in parts.items()},
        loader_scale=loader_scale,
    )


@dataclass(frozen=True, slots=True)
class Checked:
    """A prediction beside the runs that measured its configuration (NaN measured: the runs failed).

    With several runs (``--check --repeat N``) the measured figures are their medians and ``runs`` keeps every
    run's throughput, so the spread shows beside the median; :meth:`of_runs` builds one.
    """

    prediction: Prediction
    measured_samples_per_s: float
    measured_stall_fraction: float
    run_dir: str
    status: str  # the check runs' status, or why they did not run
    runs: tuple[float, ...] = ()  # each check run's throughput, in the order measured

    @classmethod
    def of_runs(
        cls, prediction: Prediction, throughputs: Sequence[float], stalls: Sequence[float], run_dir: str, status: str
    ) -> Checked:
        """The median of the runs' throughputs and stalls as the measured figures, every run kept."""
        if not throughputs or len(throughputs) != len(stalls):
            raise ValueError("of_runs needs one throughput and one stall per run")
        return cls(
            prediction,
            statistics.median(throughputs),
            statistics.median(stalls),
            run_dir,
            status,
            tuple(throughputs),
        )

    @property
    def spread(self) -> tuple[float, float]:
        """(min, max) of the runs' throughputs; (median, median) for one run, NaN for none."""
        if not self.runs:
            return (self.measured_samples_per_s, self.measured_samples_per_s)
        return (min(self.runs), max(self.runs))

    @property
    def error(self) -> float:
        """(predicted - measured) / measured throughput; NaN when either is missing. An OOM predicted for a
        configuration that failed out of memory is 0."""
        p, m = self.prediction.samples_per_s, self.measured_samples_per_s
        if math.isnan(p) or math.isnan(m) or m <= 0:
            return math.nan
        return (p - m) / m

    def to_dict(self) -> dict[str, object]:
        m, s, e = self.measured_samples_per_s, self.measured_stall_fraction, self.error
        lo, hi = self.spread
        return {
            **self.prediction.to_dict(),
            "measured_throughput_samples_per_s": None if math.isnan(m) else m,
            "measured_runs": list(self.runs) if self.runs else ([] if math.isnan(m) else [m]),
            "measured_spread": None if math.isnan(lo) else [lo, hi],
            "measured_stall_fraction": None if math.isnan(s) else s,
            "relative_error": None if math.isnan(e) else e,
            "check_run": self.run_dir,
            "check_status": self.status,
        }


def worst_error(checked: list[Checked]) -> float:
    """The largest |relative error| of throughput over the checks that have one (NaN: none)."""
    errors = [abs(c.error) for c in checked if not math.isnan(c.error)]
    return max(errors) if errors else math.nan


@dataclass(frozen=True, slots=True)
class WhatIf:
    """Every prediction from one measured run, and with ``--check`` the runs that measured them."""

    run_dir: str
    run: MeasuredRun
    cost: LoaderCost
    host: Host
    predictions: tuple[Prediction, ...]
    checked: tuple[Checked, ...] = ()
    notes: tuple[str, ...] = ()
    gap: LoaderGap = NO_GAP
    repeat: int = 1  # check runs per configuration
    storage: Storage = AS_MEASURED
    ray: dict[str, object] | None = None  # the ray predictions' measured costs (profiler.whatif.ray.RayCost)
    ray_lines: tuple[str, ...] = ()  # where they come from and what the CPUs share, in words

    @property
    def storage_line(self) -> str | None:
        """Where the predictions' bytes come from, when not as measured: what was taken out and put in."""
        st, run = self.storage, self.run
        if not st.label:
            return None
        waited = (
            f"the run's loader waited {run.storage_s_per_sample * 1e3:.3g} ms a sample for storage (MEASURED: "
            f"an emulated store's waits and reads blocked on storage)"
        )
        if st.mbps is None:
            return f"Storage: cached, PREDICTED with that wait removed; {waited}"
        kb = run.read_bytes_per_sample / 1e3
        return (
            f"Storage: a store of {st.mbps:g} MB/s serving one read at a time, PREDICTED with that wait replaced by "
            f"{kb:.0f} kB a sample read at {st.mbps:g} MB/s ({kb / st.mbps:.3g} ms; MEASURED bytes) and the store "
            f"at most {st.mbps * 1e6 / run.read_bytes_per_sample:.0f} samples/s; {waited}"
        )

    @property
    def measured_at(self) -> str:
        return loader_place(self.run.pipeline, self.run.workers)

    @property
    def header(self) -> str:
        """The line that says where every predicted figure comes from."""
        c = self.cost
        return (
            f"PREDICTED by the model in docs/whatif.md from run {self.run_dir}'s measured loader cost "
            f"{c.wall_s * 1e3:.3g} ms/sample ({c.cpu_s * 1e3:.3g} ms CPU; {c.method}; loaded in the "
            f"{self.measured_at}), {self.run.bytes_per_sample:,.0f} bytes/sample to the device, "
            + (
                f"for a host of {self.host.usable_cores} cores (--host-cores; the loader's cost per sample as measured "
                "here)"
                if self.host.given
                else f"{self.host.free_cores:.2g} free of {self.host.usable_cores} usable cores"
            )
        )

    @property
    def gap_line(self) -> str:
        """Where the worker vs main-process factor came from and its value."""
        g = self.gap
        if not g.samples:
            return f"worker vs main-process loading cost: x{g.factor:.3g} ({g.source})"
        spread = f"rounds {min(g.rounds):.3g}-{max(g.rounds):.3g}" if g.rounds else ""
        if len(g.rounds) >= 3:
            spread += f", median +/-{median_error(g.rounds):.1%}"
        cores_err = f", +/-{median_error(g.cores_rounds):.1%}" if len(g.cores_rounds) >= 3 else ""
        return (
            f"worker vs main-process loading cost: x{g.factor:.3g} MEASURED ({g.main_s * 1e3:.3g} ms/sample in the "
            f"main process, {g.worker_s * 1e3:.3g} in one worker; {g.source}; {spread}), applied where a "
            f"prediction loads elsewhere than the run ({self.measured_at})"
            + (
                f"; {g.cores_k} workers together deliver x{g.parallel(g.cores_k):.3g} one worker's rate "
                f"({g.cores_scaling:.0%} each{cores_err}) MEASURED, applied to predictions with more than one worker"
                if g.cores_k > 1
                else ""
            )
            + (
                f"; UNSTEADY: its rounds differ by more than {GAP_UNSTEADY:g}x, the host was busy (see the load "
                "average) and the factor is not to be trusted"
                if g.unsteady
                else ""
            )
        )

    def to_dict(self) -> dict[str, object]:
        rows = [c.to_dict() for c in self.checked] if self.checked else [p.to_dict() for p in self.predictions]
        worst = worst_error(list(self.checked))
        return {
            "run_dir": self.run_dir,
            "run_id": self.run.run_id,
            "model": "docs/whatif.md",
            "header": self.header,
            "worker_gap_line": self.gap_line,
            "storage_line": self.storage_line,
            **({"ray": {**self.ray, "lines": list(self.ray_lines)}} if self.ray is not None else {}),
            "measured": {
                "pipeline": self.run.pipeline,
                "device_kind": self.run.device_kind,
                "batch_size": self.run.batch_size,
                "workers": self.run.workers,
                "throughput_samples_per_s": self.run.throughput,
                "bytes_per_sample": self.run.bytes_per_sample,
                "loader_cost": self.cost.to_dict(),
                "loaded_in": self.measured_at,
                "host": self.host.to_dict(),
            },
            "worker_gap": self.gap.to_dict(),
            **({"check_repeat": self.repeat} if self.checked else {}),
            "predictions": rows,
            **({"worst_relative_error": None if math.isnan(worst) else worst} if self.checked else {}),
            "notes": list(self.notes),
        }
