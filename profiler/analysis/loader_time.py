"""Where the loader processes' time went: a row per process (the training process's main thread, each loader
worker's loop thread), the workers' mean, and what their time says about the input pipeline.

Pure: the figures are the sampled means of the ``loader`` source (:mod:`profiler.core.sources.blocked`) over the
measured window, read from the summary's host figures; docs/metrics.md, "Loader time", defines them. The CPU and
run-queue shares are exact (schedstat); the split of the blocked time is sampled (system calls polled at
``POLL_HZ``), and the method says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from profiler.analysis.meta import JSON
from profiler.analysis.parts import HostFigures
from profiler.analysis.stats import json_safe

PARTS = ("cpu", "runq", "storage", "network", "queue", "sleep", "lock", "other")
DOMINANT = 40.0  # % of the workers' time at or above which one part names the bottleneck
SHORT_OF_CORES = 20.0  # run-queue % of the workers' time that makes "computing" "short of cores"
METHOD = (
    "schedstat of each loader process's loop thread (time on a CPU, time waiting for one: exact); the rest of "
    "the time split by the system call the thread was blocked in, polled from /proc 25 times a second (sampled)"
)
_METRIC = re.compile(r"loader\.(main|w\d+)\.(?:([a-z]+)_pct|polls_([a-z]+))")
_RATE = re.compile(r"loader\.(main|w\d+)\.(read|storage)_mbps")
READS_METHOD = (
    "/proc/PID/io of the training process and each worker: rchar (bytes through read calls: files, sockets, "
    "pipes) and read_bytes (bytes the kernel read from storage, not served from the page cache), summed"
)
BLOCKED = PARTS[2:]


@dataclass(frozen=True, slots=True)
class ProcessTime:
    """One process's time, % of wall time: on a CPU, waiting for one, and blocked on each kind of wait."""

    label: str  # "main" (the training process's main thread) or a worker's label ("w0", ...)
    cpu: float
    runq: float
    storage: float
    network: float
    queue: float  # a worker waiting for the next indices: the loader is ahead
    sleep: float
    lock: float
    other: float


@dataclass(frozen=True, slots=True)
class Reads:
    """What the loader processes (the training process and its workers) read, MB/s over the window."""

    method: str
    read_mbps: float  # through read calls (files, sockets, pipes)
    storage_mbps: float  # from storage: what the page cache did not serve
    storage_bytes_per_sample: float  # storage bytes / samples trained (NaN without a throughput)


@dataclass(frozen=True, slots=True)
class LoaderTime:
    method: str
    processes: tuple[ProcessTime, ...]  # main first, then the workers by label
    workers: ProcessTime | None  # the workers' mean (None with no worker measured)
    bottleneck: str | None  # "ahead", "storage", "network", "cpu", "cores", "sleep", "lock", or None
    headline: str | None  # one sentence quoting the figures, or None
    reads: Reads | None = None  # None where /proc/PID/io could not be read

    def to_dict(self) -> JSON:
        out: JSON = asdict(self)
        return json_safe(out)


def loader_time(host: HostFigures, samples_per_s: float = math.nan) -> LoaderTime | None:
    """The loader processes' time from the sampled means; None when the ``loader`` source gave nothing.

    The off-CPU share (exact) is split by the blocked polls of the whole window: the ratio of the polls' means
    is the ratio of their counts. With no blocked poll in the window it is all ``other``.
    """
    pct: dict[str, dict[str, float]] = {}
    polls: dict[str, dict[str, float]] = {}
    for metric, value in host.by_metric.items():
        m = _METRIC.fullmatch(metric)
        if m is not None:
            part, category = m.group(2), m.group(3)
            (pct if part else polls).setdefault(m.group(1), {})[part or category] = value
    measured = [k for k, v in pct.items() if not math.isnan(v.get("cpu", math.nan))]
    if not measured:
        return None
    order = sorted(measured, key=lambda k: (k != "main", int(k[1:]) if k != "main" else 0))
    processes = tuple(_row(k, pct[k], polls.get(k, {})) for k in order)
    workers = [p for p in processes if p.label != "main"]
    mean = _mean(workers) if workers else None
    bottleneck, headline = _read(mean, len(workers)) if mean is not None else (None, None)
    return LoaderTime(METHOD, processes, mean, bottleneck, headline, _reads(host, samples_per_s))


def _reads(host: HostFigures, samples_per_s: float) -> Reads | None:
    rates: dict[str, float] = {"read": 0.0, "storage": 0.0}
    seen = False
    for metric, value in host.by_metric.items():
        m = _RATE.fullmatch(metric)
        if m is not None and not math.isnan(value):
            rates[m.group(2)] += value
            seen = True
    if not seen:
        return None
    per_sample = rates["storage"] * 1e6 / samples_per_s if samples_per_s > 0 else math.nan
    return Reads(READS_METHOD, rates["read"], rates["storage"], per_sample)


def _row(label: str, pct: dict[str, float], polls: dict[str, float]) -> ProcessTime:
    off = pct.get("off", math.nan)
    counts = {c: 0.0 if math.isnan(v := polls.get(c, 0.0)) else v for c in BLOCKED}
    total = math.fsum(counts.values())
    shares = (
        {c: off * counts[c] / total for c in BLOCKED} if total > 0 else {**dict.fromkeys(BLOCKED, 0.0), "other": off}
    )
    return ProcessTime(label, pct.get("cpu", math.nan), pct.get("runq", math.nan), *(shares[c] for c in BLOCKED))


def busy_pct(p: ProcessTime) -> float:
    """The process's busy share, % of wall time: all of it but the wait for work (on a CPU, waiting for one, and
    blocked in the work itself: a read, a sleep, a lock)."""
    return math.fsum(getattr(p, part) for part in PARTS if part != "queue")


def _mean(rows: list[ProcessTime]) -> ProcessTime:
    parts = [math.fsum(getattr(r, p) for r in rows) / len(rows) for p in PARTS]
    return ProcessTime("workers", *parts)


def _read(w: ProcessTime, n: int) -> tuple[str | None, str | None]:
    """The part that took most of the workers' time, if any took :data:`DOMINANT` % or more, and its sentence."""
    busy = w.cpu + w.runq
    shares = {"ahead": w.queue, "storage": w.storage, "network": w.network, "sleep": w.sleep, "lock": w.lock}
    shares["cpu"] = busy
    name = max(shares, key=lambda k: shares[k])
    if not shares[name] >= DOMINANT:
        return None, None
    who = f"The {n} loader worker(s)"
    if name == "cpu":
        if w.runq >= SHORT_OF_CORES:
            return "cores", (
                f"{who} computed {w.cpu:.0f}% of their time and waited for a CPU {w.runq:.0f}%: the loader is "
                "short of cores; more workers will not help, a cheaper pipeline (DALI, smaller stored images) will"
            )
        return "cpu", (
            f"{who} were on a CPU {w.cpu:.0f}% of their time: the loader is CPU-bound; more workers help while "
            "cores are idle, a cheaper pipeline helps either way"
        )
    text = {
        "ahead": f"waited for work {w.queue:.0f}% of their time: the loader is ahead of the training (every "
        "prefetch slot full); more workers will not help",
        "storage": f"were blocked reading from storage {w.storage:.0f}% of their time: the loader is fetch-bound; "
        "a cached or faster store, or larger sequential reads, will help; more workers only while the store "
        "has bandwidth to spare",
        "network": f"were blocked on the network {w.network:.0f}% of their time: the loader is fetch-bound; "
        "more workers (more requests in flight) help while the server has bandwidth to spare, and so does a "
        "local cache",
        "sleep": f"slept {w.sleep:.0f}% of their time (time.sleep in the data set or a library it calls)",
        "lock": f"waited on a lock or a thread {w.lock:.0f}% of their time",
    }[name]
    return name, f"{who} {text}"
