"""The typed parts a :class:`~profiler.analysis.summary.Summary` is built from.

Both the summary (which assembles them) and the verdict rules (which read them before the Summary exists)
import this module; it imports neither, so there is no import circle.

Invariants:
- Every part is a frozen, slotted dataclass; its ``to_dict()`` is exactly that part's object in summary.json
  (keys are only ever added: a reader of an older summary.json keeps working). NaN stays NaN here: the
  Summary's ``to_dict`` turns it into null once, for the whole document.
- A figure that was not measured is NaN (or None where the JSON has always said null), never zero.
- Sampled host and NVML figures are kept per metric name (``sys.cpu_pct``); the JSON key
  (``sys_cpu_pct_mean``) is derived in one place, :func:`metric_key`, and readers use the typed accessors.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from profiler.analysis.meta import JSON, as_json, objects, opt_int, opt_str

CORE_PHASES = ("h2d", "compute")  # always in the breakdown, even when never entered
SYNC_PHASE = "sync"  # a top-level phase of that name, or "compute/sync" nested in compute: the breakdown's sync
NESTED_SYNC = "compute/sync"
STACK_PHASES = ("data_wait", "h2d", "compute", "other")
# Device kinds whose phases carry device-event times, and that instrument's name: the simulated accelerator's
# events (``profiler.sim.device.SimTimer``) enter every figure through the same code as CUDA's.
EVENT_TIMERS = {"cuda": "cuda-events", "sim": "sim-events"}
SIMULATED = "sim"  # the device kind of a simulated accelerator: every figure from it is labelled simulated
_NAN = math.nan


def event_timer(kind: object) -> str | None:
    """``cuda-events`` / ``sim-events`` for a device kind whose phases carry event times, else None."""
    return EVENT_TIMERS.get(kind) if isinstance(kind, str) else None


def nvml_source(kind: object) -> str:
    """The name of the sampled source whose figures are the device's NVML figures (``nvml-sim`` when simulated)."""
    return "nvml-sim" if kind == SIMULATED else "nvml"


def device_where(device: Mapping[str, object]) -> str | None:
    """Where a recorded device ran: ``sim:NAME`` for a simulated one (its tensors sit on the host, so its
    ``torch_device`` would say ``cpu``), else ``cuda:0`` / ``cpu``, else the kind."""
    if device.get("kind") == SIMULATED:
        sim = device.get("sim")
        name = sim.get("accelerator") if isinstance(sim, dict) else None
        return f"sim:{name}" if name else "sim"
    where = device.get("torch_device") or device.get("kind")
    return None if where is None else str(where)


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Step time in ms over the measured steps: mean and linearly interpolated p50 / p90."""

    mean: float
    p50: float
    p90: float

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p50": self.p50, "p90": self.p90}


@dataclass(frozen=True, slots=True)
class Breakdown:
    """Mean ms per measured step: data wait, h2d, compute, sync, the user's own top-level phases, and the rest.

    ``user`` holds the phases named with ``s.phase(name)`` beyond h2d, compute and sync, in name order. A part
    can be read by name (``b["compute"]``, ``b.get(name)``) because user phases have no field of their own.

    ``sync`` is the time blocked waiting for the other ranks of a data-parallel job (a top-level phase ``sync``
    or a phase ``compute/sync`` nested in compute; docs/metrics.md): 0.0 when the run recorded none, and then
    ``sync_recorded`` is False. ``to_dict()`` (summary.json) always has the key; ``items()`` (what reports
    print) lists it only for a run that recorded a sync phase, so a single-process report has no empty row.
    """

    data_wait: float
    h2d: float
    compute: float
    other: float
    user: tuple[tuple[str, float], ...] = ()
    sync: float = 0.0
    sync_recorded: bool = False

    def items(self) -> list[tuple[str, float]]:
        """(part, ms) in report order: data_wait, h2d, compute, sync (when recorded), user phases, other."""
        core = [("data_wait", self.data_wait), ("h2d", self.h2d), ("compute", self.compute)]
        sync = [("sync", self.sync)] if self.sync_recorded else []
        return [*core, *sync, *self.user, ("other", self.other)]

    def parts(self) -> list[tuple[str, float]]:
        """(part, ms) of every part summary.json has: ``items()`` with ``sync`` always in it."""
        core = [("data_wait", self.data_wait), ("h2d", self.h2d), ("compute", self.compute), ("sync", self.sync)]
        return [*core, *self.user, ("other", self.other)]

    def get(self, name: str, default: float = _NAN) -> float:
        return next((v for k, v in self.parts() if k == name), default)

    def __getitem__(self, name: str) -> float:
        for k, v in self.parts():
            if k == name:
                return v
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(k == name for k, _ in self.parts())

    def to_dict(self) -> dict[str, float]:
        return dict(self.parts())


@dataclass(frozen=True, slots=True)
class InputStall:
    """Ms per step the device waited for input: data wait and copy time not overlapped by device compute."""

    data_wait: float
    h2d: float

    def to_dict(self) -> dict[str, float]:
        return {"data_wait": self.data_wait, "h2d": self.h2d}


@dataclass(frozen=True, slots=True)
class DeviceTimes:
    """Ms per step of CUDA-event device time (CUDA runs with event timing only)."""

    h2d: float
    compute: float

    def items(self) -> list[tuple[str, float]]:
        return [("h2d", self.h2d), ("compute", self.compute)]

    def to_dict(self) -> dict[str, float]:
        return dict(self.items())


@dataclass(frozen=True, slots=True)
class RunDevice:
    """The device as the run recorded it, plus what the NVML source said.

    ``recorded`` keeps every key of the stored device object in its order (simulated devices add their own),
    so the JSON carries them all; the common ones have fields.
    """

    kind: str | None
    name: str | None
    torch_device: str | None
    nvml: str  # "available", "unavailable: <reason>" or "not sampled"
    recorded: tuple[tuple[str, object], ...] = ()

    @classmethod
    def from_meta(cls, device: Mapping[str, object], nvml: str) -> RunDevice:
        kind, name, where = (opt_str(device.get(k)) for k in ("kind", "name", "torch_device"))
        return cls(kind, name, where, nvml, tuple(device.items()))

    @property
    def where(self) -> str | None:
        """``cuda:0`` / ``cpu`` / ``sim:NAME``, or the kind where no torch device was recorded."""
        return device_where(dict(self.recorded) or {"kind": self.kind, "torch_device": self.torch_device})

    @property
    def simulated(self) -> bool:
        return self.kind == SIMULATED

    @property
    def sim(self) -> JSON:
        """The simulated accelerator's recorded options (``device``, ``accelerator``, ``full_name``, ...); {}
        for a real device."""
        return dict(as_json(dict(self.recorded).get("sim"))) if self.simulated else {}

    @property
    def sim_label(self) -> str:
        """``sim:h100,precision=tf32,efficiency=0.13`` (what ``--device`` was), or ``sim:h100`` when not recorded."""
        return str(self.sim.get("device") or self.where or "sim")

    @property
    def short_name(self) -> str:
        """What a sentence calls the device: ``H100`` for ``sim:h100``, else the recorded name."""
        if self.simulated and self.sim.get("accelerator"):
            return str(self.sim["accelerator"]).upper()
        return self.name or self.where or "device"

    def to_dict(self) -> JSON:
        return {**dict(self.recorded), "nvml": self.nvml}


def metric_key(metric: str) -> str:
    """The summary.json key of a sampled metric: ``sys.cpu_pct`` -> ``sys_cpu_pct_mean``; memory -> ``_max``."""
    return metric.replace(".", "_") + ("_max" if is_peak(metric) else "_mean")


def is_peak(metric: str) -> bool:
    """Memory is summarised by its maximum (the peak is what runs out), everything else by its mean."""
    return metric.endswith(("_mb", "_total_mb"))


def _labelled(by_metric: dict[str, float], pattern: str) -> dict[str, float]:
    """{label: value} of the metrics fully matching ``pattern``, whose one group is the label."""
    out: dict[str, float] = {}
    for metric, value in by_metric.items():
        m = re.fullmatch(pattern, metric)
        if m:
            out[m.group(1)] = value
    return out


@dataclass(frozen=True, slots=True)
class HostFigures:
    """psutil figures over the measured window: per metric, the mean (the max for memory). 100% = one core,
    except ``sys_cpu_pct`` (all cores)."""

    by_metric: dict[str, float] = field(default_factory=dict)  # sorted by metric name

    def metric(self, name: str) -> float:
        return self.by_metric.get(name, _NAN)

    @property
    def measured(self) -> bool:
        return bool(self.by_metric)

    @property
    def main_cpu_pct(self) -> float:
        return self.metric("proc.main.cpu_pct")

    @property
    def children_cpu_pct(self) -> float:
        return self.metric("proc.children.cpu_pct")

    @property
    def sys_cpu_pct(self) -> float:
        return self.metric("sys.cpu_pct")

    @property
    def total_rss_mb_max(self) -> float:
        return self.metric("proc.total.rss_mb")

    @property
    def worker_cpu_pct(self) -> dict[str, float]:
        """{"w0": mean CPU %, ...}: one entry per loader worker process seen."""
        return _labelled(self.by_metric, r"proc\.(w\d+)\.cpu_pct")

    def to_dict(self) -> dict[str, float]:
        return {metric_key(m): v for m, v in self.by_metric.items()}


@dataclass(frozen=True, slots=True)
class NvmlFigures:
    """NVML figures over the measured window, per ``gpuN.*`` metric: the mean (the max for memory).

    ``simulated``: they came from the simulated accelerator's NVML source (``nvml-sim``), never from a GPU;
    every renderer says so."""

    by_metric: dict[str, float] = field(default_factory=dict)  # sorted by metric name
    simulated: bool = False

    @property
    def util_pct(self) -> dict[str, float]:
        """{"gpu0": mean utilization.gpu %, ...}; not ``mem_util_pct`` (memory-controller activity)."""
        return _labelled(self.by_metric, r"(gpu\d+)\.util_pct")

    def activity(self) -> dict[str, dict[str, float]]:
        """{"gpu0": {"graphics": %, "sm_active": %, ...}}: the GPM counters' means (a GPU without GPM: its driver
        samples' mean as {"util_samples": %}); only GPUs that have either."""
        out: dict[str, dict[str, float]] = {}
        for metric, value in self.by_metric.items():
            gpu, _, name = metric.partition(".")
            if name.startswith("gpm_") or name == "util_samples_pct":
                out.setdefault(gpu, {})[name.removeprefix("gpm_").removesuffix("_pct")] = value
        return out

    def to_dict(self) -> dict[str, float]:
        return {metric_key(m): v for m, v in self.by_metric.items()}


@dataclass(frozen=True, slots=True)
class Lateness:
    """How late the sampler's rounds started after their deadlines, ms."""

    mean: float
    p95: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return {"mean": self.mean, "p95": self.p95, "max": self.max}


@dataclass(frozen=True, slots=True)
class SamplerHealth:
    """Whether the background sampler kept its rate, and what each metric source reported."""

    hz_requested: float
    hz_achieved: float
    samples: int
    lateness_ms: Lateness
    read_ms_mean: float
    missed_deadlines: int | None  # written only at a clean close
    # "available" | "unavailable: <why>" | "lost: <why>" | "ended: <why>" (the process it followed exited)
    sources: dict[str, str] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    last_error: dict[str, str] = field(default_factory=dict)
    stopped_at: dict[str, float] = field(default_factory=dict)  # name -> s into the run when a source was lost

    def source(self, name: str, default: str = "not sampled") -> str:
        return self.sources.get(name, default)

    def status_at(self, name: str) -> str:
        """A source's status with, for one lost mid-run, when: ``lost at 12.3 s: GPU 0: ...``."""
        status = self.source(name)
        t = self.stopped_at.get(name)
        return status if t is None else status.replace("lost: ", f"lost at {t:.1f} s: ", 1)

    def to_dict(self) -> JSON:
        return {
            "hz_requested": self.hz_requested,
            "hz_achieved": self.hz_achieved,
            "samples": self.samples,
            "lateness_ms": self.lateness_ms.to_dict(),
            "read_ms_mean": self.read_ms_mean,
            "missed_deadlines": self.missed_deadlines,
            "sources": dict(self.sources),
            "errors": dict(self.errors),
            "last_error": dict(self.last_error),
            "stopped_at": dict(self.stopped_at),
        }


@dataclass(frozen=True, slots=True)
class Sources:
    """Where each headline figure came from, in words (every figure names its instrument)."""

    step_time: str
    data_wait: str
    h2d: str
    compute: str
    stall_fraction: str
    device_busy_fraction: str
    host: str
    nvml: str
    workers: str | None = None  # zero-code runs only: how the workers were counted
    sync: str = (
        "host perf_counter around the sync phase (a top-level 'sync', or 'compute/sync' nested in compute): "
        "time blocked waiting for the other ranks"
    )

    def part(self, name: str) -> str | None:
        """The instrument of a breakdown part; None for user phases and ``other`` (the reader says why)."""
        return {"data_wait": self.data_wait, "h2d": self.h2d, "compute": self.compute, "sync": self.sync}.get(name)

    def to_dict(self) -> dict[str, str]:
        out = {
            "step_time": self.step_time,
            "data_wait": self.data_wait,
            "h2d": self.h2d,
            "compute": self.compute,
            "sync": self.sync,
            "stall_fraction": self.stall_fraction,
            "device_busy_fraction": self.device_busy_fraction,
            "host": self.host,
            "nvml": self.nvml,
        }
        if self.workers is not None:
            out["workers"] = self.workers
        return out


@dataclass(frozen=True, slots=True)
class Cost:
    """Cost at the measured throughput (``--price-per-hour``)."""

    price_per_hour: float
    per_1k_samples: float
    per_epoch: float  # NaN when the epoch size is not known
    epoch_samples: int | None

    def to_dict(self) -> dict[str, float | None]:
        return {
            "price_per_hour": self.price_per_hour,
            "per_1k_samples": self.per_1k_samples,
            "per_epoch": self.per_epoch,
            "epoch_samples": self.epoch_samples,
        }


@dataclass(frozen=True, slots=True)
class BadFile:
    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class BadSamples:
    """Samples the loader could not read (``--on-bad-sample``): the policy, how many, the first files."""

    policy: str | None
    skipped: int
    files: tuple[BadFile, ...] = ()

    @classmethod
    def from_meta(cls, d: Mapping[str, object]) -> BadSamples:
        files = tuple(BadFile(str(f["path"]), str(f["reason"])) for f in objects(d.get("files")))
        return cls(opt_str(d.get("policy")), opt_int(d.get("skipped")) or 0, files)

    def to_dict(self) -> JSON:
        return {
            "policy": self.policy,
            "skipped": self.skipped,
            "files": [{"path": f.path, "reason": f.reason} for f in self.files],
        }


@dataclass(frozen=True, slots=True)
class Estimate:
    """A share estimated from stack samples, with its Wilson 95% interval and the samples it rests on."""

    fraction: float
    low: float
    high: float
    samples: int

    def to_dict(self) -> dict[str, float]:
        return {"fraction": self.fraction, "low": self.low, "high": self.high, "samples": self.samples}


@dataclass(frozen=True, slots=True)
class PhaseShares:
    """The main thread's phase shares over some py-spy samples (the whole run or one window)."""

    samples: int
    seconds: float
    data_wait: Estimate
    h2d: Estimate
    compute: Estimate
    other: Estimate

    def phase(self, name: str) -> Estimate:
        return {"data_wait": self.data_wait, "h2d": self.h2d, "compute": self.compute, "other": self.other}[name]

    def to_dict(self) -> JSON:
        return {"samples": self.samples, "seconds": self.seconds, **{p: self.phase(p).to_dict() for p in STACK_PHASES}}


@dataclass(frozen=True, slots=True)
class StackWindow:
    t_start: float
    t_end: float
    shares: PhaseShares

    def to_dict(self) -> JSON:
        return {"t_start": self.t_start, "t_end": self.t_end, **self.shares.to_dict()}


@dataclass(frozen=True, slots=True)
class StackParse:
    """How the py-spy file parsed."""

    format: str  # "speedscope" | "raw"
    records: int
    samples: int
    bad_records: int
    truncated: int
    error: str | None

    def to_dict(self) -> JSON:
        return {
            "format": self.format,
            "records": self.records,
            "samples": self.samples,
            "bad_records": self.bad_records,
            "truncated": self.truncated,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class StackEstimate:
    """Main-thread phase fractions from py-spy samples. ``overall`` is None when py-spy recorded no usable
    sample; ``note`` then says so and the JSON holds only ``parse`` and ``note``."""

    parse: StackParse
    overall: PhaseShares | None = None
    note: str | None = None
    method: str = ""
    rate_hz: float = _NAN
    windows: tuple[StackWindow, ...] = ()
    main_thread_rule: str = ""
    trimmed_outside_training: int = 0
    pin_memory_thread_samples: int = 0
    notes: tuple[str, ...] = ()

    def to_dict(self) -> JSON:
        if self.overall is None:
            return {"parse": self.parse.to_dict(), "note": self.note}
        return {
            "method": self.method,
            "rate_hz": self.rate_hz,
            "overall": self.overall.to_dict(),
            "windows": [w.to_dict() for w in self.windows],
            "main_thread_rule": self.main_thread_rule,
            "trimmed_outside_training": self.trimmed_outside_training,
            "pin_memory_thread_samples": self.pin_memory_thread_samples,
            "notes": list(self.notes),
            "parse": self.parse.to_dict(),
        }


@dataclass(frozen=True, slots=True)
class TopFunction:
    function: str  # "qualname (file.py)"
    of_category: float


@dataclass(frozen=True, slots=True)
class CategoryShare:
    """One worker CPU category: its share of busy worker samples and its top functions."""

    share: Estimate
    top: tuple[TopFunction, ...] = ()

    def to_dict(self) -> JSON:
        top = [{"function": t.function, "of_category": t.of_category} for t in self.top]
        return {**self.share.to_dict(), "top": top}


@dataclass(frozen=True, slots=True)
class LoaderAttribution:
    """Where the DataLoader workers' CPU goes, from py-spy samples of the worker processes."""

    method: str
    workers: int
    samples: int
    idle: int
    active: int
    busy_seconds: float | None
    categories: tuple[tuple[str, CategoryShare], ...]  # every category, in the table's order
    headline: str | None
    notes: tuple[str, ...] = ()

    def by_share(self) -> list[tuple[str, CategoryShare]]:
        """The categories that have samples, largest share first (stable: table order among equals)."""
        seen = [(c, s) for c, s in self.categories if s.share.samples]
        return sorted(seen, key=lambda kv: -kv[1].share.fraction)

    def to_dict(self) -> JSON:
        return {
            "method": self.method,
            "workers": self.workers,
            "samples": self.samples,
            "idle": self.idle,
            "active": self.active,
            "busy_seconds": self.busy_seconds,
            "categories": {c: s.to_dict() for c, s in self.categories},
            "headline": self.headline,
            "notes": list(self.notes),
        }


def figure_sources(events: str | None, busy_source: str, nvml: str, *, simulated: bool = False) -> Sources:
    """Each headline figure's instrument in words; a simulated device's figures say SIMULATED (docs/metrics.md)."""
    on_events = events is not None
    dev = "queued simulated device compute (sim-events)" if simulated else "queued device compute (CUDA events)"
    if simulated:
        compute = (
            "SIMULATED device time of the compute phase (sim-events: FLOPs / (peak x efficiency), docs/sim.md); "
            "it overlaps the host's wait for the next batch, so the parts can add up to more than the step"
        )
    else:
        compute = "host perf_counter around the compute phase" + (
            ", plus the copy's wait for queued compute; device time: device_ms_per_step" if on_events else ""
        )
    if not on_events:
        stall = "(data wait + h2d) / step time, host perf_counter"
    elif simulated:
        stall = (
            "(data wait + copy time, host-blocked or simulated, not overlapped by simulated device compute) / step time"
        )
    else:
        stall = "(data wait + copy time, host-blocked or CUDA-event, not overlapped by device compute) / step time"
    if nvml.startswith("lost"):
        nvml_how = f"NVML utilization.gpu (driver-averaged over 1/6 s to 1 s), sampled until NVML was {nvml}"
    elif nvml != "available":
        nvml_how = f"not measured ({nvml})"
    elif simulated:
        nvml_how = (
            "SIMULATED NVML (nvml-sim): utilization.gpu as NVML defines it, the simulated device's kernel-busy share "
            "of each completed sample period, sampled"
        )
    else:
        nvml_how = "NVML utilization.gpu (driver-averaged over 1/6 s to 1 s), sampled"
    return Sources(
        step_time="host perf_counter, from one next() call on the loader to the next",
        data_wait="host perf_counter around next() on the loader",
        h2d="host perf_counter around the copy" + (f", less the time it waited for {dev}" if on_events else ""),
        compute=compute,
        stall_fraction=stall,
        device_busy_fraction={
            "cuda-events": "union of CUDA-event intervals of all phases / wall time",
            "sim-events": "SIMULATED: union of the simulated device's event intervals of all phases / wall time",
            "host-compute-phase": "compute phase time / wall time (CPU device: no device clock)",
            "none": "not measured",
        }[busy_source],
        host="psutil, sampled by the background sampler",
        nvml=nvml_how,
    )
