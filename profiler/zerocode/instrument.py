"""Exact step figures for a program stallscope launched: the start-up module's records, turned into steps.

``stallscope run -- CMD`` starts CMD with :func:`child_env`: the directory of
``profiler/zerocode/boot/`` first on ``PYTHONPATH``, whose ``sitecustomize`` times every DataLoader iteration
in every Python process the command starts and writes ``p<pid>.jsonl`` files (format: the boot module's
docstring). :class:`InstrumentReader` tails those files while the command runs and turns the training
loader's iterations into the StepRows and PhaseRows a Session writes, so the store, the report, the live view
and the trace read them as they read any run.

The rules (docs/zero-code.md, "Exact step figures"):

- **The training loader** of a process is the first loader to reach ``LOCK_CALLS`` ``next()`` calls while
  holding at least twice any other loader's calls (a short sanity-check pass over a validation loader first
  does not take it). Steps come from one process: rank 0's under a launcher, else the process that iterated
  most. A command that ended early (Ctrl-C, a crash) before any loader had ``LOCK_CALLS`` calls still has the
  steps that ran: at the last poll the rule holds from ``EARLY_CALLS`` calls, and the run says so.
- **A step** runs from one ``next()`` call on the training loader to the next call (or to the call that
  ends the epoch); its data wait is the call's duration, plus ``iter()``'s for an epoch's first step (workers
  start there), as under ``Session.wrap``. The last batch's step has no end and is not counted.
- **Phases:** other loaders iterated inside a step are a phase ``loader FILE:LINE`` each (first call's start to
  last call's end); the rest of the step after its batch arrived is ``compute``: the script's whole step body
  (forward, backward, optimizer, logging, host-to-device copies).
"""

from __future__ import annotations

import collections
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from profiler.core.kernel_windows.trace_file import KEEP, activities, recorded
from profiler.core.rows import KernelWindow, PhaseRow, StepRow
from profiler.zerocode.boot.stallscope_instrument import DIR_ENV, OVERRIDES_ENV, STOP_ENV

BOOT_DIR = Path(__file__).with_name("boot")
LOCK_CALLS = 20
EARLY_CALLS = 2  # the least calls that make a step (its start and its end), for a command that ended early
WARMUP_STEPS = 1  # the first step starts the workers and fills their queues


@dataclass(frozen=True, slots=True)
class TrialStop:
    """When the start-up module ends a tuning trial's process (SystemExit(0) from ``next()``): after ``calls``
    batches of one loader, or ``seconds`` after its first batch once it has returned ``min_calls``."""

    calls: int | None = None
    seconds: float | None = None
    min_calls: int = 0

    def env(self) -> str:
        calls = "" if self.calls is None else str(self.calls)
        return calls if self.seconds is None else f"{calls},{self.seconds:g},{self.min_calls}"


def child_env(
    directory: Path,
    base: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
    stop: TrialStop | None = None,
) -> dict[str, str]:
    """The environment for the command: the boot directory first on PYTHONPATH, where to write, what to change."""
    env = dict(os.environ if base is None else base)
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(BOOT_DIR) + (os.pathsep + rest if rest else "")
    env[DIR_ENV] = str(directory)
    if overrides:
        env[OVERRIDES_ENV] = json.dumps(dict(overrides))
    if stop is not None:
        env[STOP_ENV] = stop.env()
    return env


@dataclass
class LoaderInfo:
    """One DataLoader a process built: where, with what knobs, and how often it was iterated."""

    pid: int
    id: int
    file: str
    line: int
    args: dict[str, Any]
    applied: dict[str, Any]
    kind: str = "DataLoader"  # or a DALI iterator's class name
    calls: int = 0

    @property
    def site(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_meta(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "site": self.site,
            "file": self.file,
            "line": self.line,
            "args": self.args,
            "overrides": self.applied,
            "kind": self.kind,
            "next_calls": self.calls,
        }


@dataclass
class Process:
    """One instrumented process's records so far."""

    pid: int
    info: dict[str, Any] = field(default_factory=dict)
    loaders: dict[int, LoaderInfo] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)  # iter / next / end / stop, in order
    aside: str | None = None
    offset: int = 0  # bytes of its file read
    training: int | None = None  # the training loader's id, once chosen
    stopped: str | None = None  # why the start-up module ended it (a tuning trial): "steps" or "seconds"
    device: dict[str, Any] | None = None  # its CUDA device, once the start-up module's device clock started
    dev: dict[int, float] = field(default_factory=dict)  # event number -> when the device reached it
    dev_off: str | None = None  # why the device clock stopped
    windows: list[dict[str, Any]] = field(default_factory=list)  # its kernel windows' records (kwin)
    windows_off: str | None = None  # why its kernel windows stopped
    ray_stats: dict[int, dict[str, Any]] = field(default_factory=dict)  # a Ray loader's latest epoch, Ray's timers

    @property
    def rank(self) -> int | None:
        rank = self.info.get("rank")
        return rank if isinstance(rank, int) else None

    def take(self, rec: dict[str, Any]) -> None:
        kind = rec.get("k")
        if kind == "proc":
            self.info = rec
        elif kind == "aside":
            self.aside = str(rec.get("why"))
        elif kind == "dev":
            self.dev[int(rec["m"])] = float(rec["t"])
        elif kind == "devclock":
            self.device = {"index": int(rec["device"]), "name": str(rec.get("name") or "?")}
        elif kind == "dev_off":
            self.dev_off = str(rec.get("why"))
        elif kind == "kwin":
            self.windows.append(rec)
        elif kind == "kwin_off":
            self.windows_off = str(rec.get("why"))
        elif kind == "ray_stats":
            self.ray_stats[int(rec["id"])] = rec
        elif kind == "loader":
            lid = int(rec["id"])
            args, applied = dict(rec["args"]), dict(rec.get("applied") or {})
            kind = str(rec.get("kind") or "DataLoader")
            self.loaders[lid] = LoaderInfo(self.pid, lid, str(rec["file"]), int(rec["line"]), args, applied, kind)
        elif kind in ("iter", "next", "end", "stop"):
            if kind == "stop":
                self.stopped = str(rec.get("why") or "steps")
            if kind == "next" and (loader := self.loaders.get(int(rec["id"]))) is not None:
                loader.calls += 1
            self.records.append(rec)

    def choose_training(self, least: int = LOCK_CALLS) -> int | None:
        """The training loader's id once one qualifies with ``least`` calls or more (see the module docstring);
        fixed from then on."""
        if self.training is None:
            ranked = sorted(self.loaders.values(), key=lambda lo: -lo.calls)
            if ranked and ranked[0].calls >= least and (len(ranked) < 2 or ranked[0].calls >= 2 * ranked[1].calls):
                self.training = ranked[0].id
        return self.training


class StepBuilder:
    """Turns one process's training-loader records into steps, as they arrive (rules: the module docstring)."""

    def __init__(self, proc: Process, t0: float, warmup: int) -> None:
        self.proc = proc
        self.t0 = t0
        self.warmup = warmup
        self.steps = 0
        self.runq_seen = False  # a record carried the training thread's run-queue wait
        self.rows: list[StepRow] = []  # every step built (for the per-rank figures)
        self._done = 0  # index into proc.records of the first record not yet turned into steps
        self._open: _OpenStep | None = None
        self._held: collections.deque[tuple[StepRow, _OpenStep, _Edge]] = collections.deque()
        self._iter: dict[str, Any] | None = None  # the training loader's iter(): its epoch's first step starts there

    def build(self, final: bool = False) -> list[tuple[StepRow, list[PhaseRow]]]:
        """The steps completed since the last call whose device times (on CUDA) have arrived; ``final``: every
        step completed, with the device times there are."""
        proc, train = self.proc, self.proc.training
        for rec in proc.records[self._done :]:
            self._done += 1
            if rec["id"] != train:
                if self._open is not None:
                    self._open.others.append(rec)
                continue
            kind = rec["k"]
            if self._open is not None and kind in ("next", "end", "iter"):
                self._close(self._open, _Edge(float(rec["t0"]), rec.get("q0"), rec.get("m0")))
                self._open = None
            if kind == "iter":
                self._iter = rec
            elif kind == "next":
                first, self._iter = self._iter or rec, None
                q0, q1 = first.get("q0"), rec.get("q1")
                self._open = _OpenStep(float(first["t0"]), float(rec["t1"]), rec.get("n"), q0, q1, rec.get("m1"))
        return self._release(final)

    def _close(self, step: _OpenStep, end: _Edge) -> None:
        index = self.steps
        self.steps += 1
        n = step.samples if isinstance(step.samples, int) else None
        wait_q = _ns_between(step.q0, step.q1)
        step_q = _ns_between(step.q0, end.q)
        self.runq_seen = self.runq_seen or step_q is not None
        row = StepRow(
            index, step.t0 - self.t0, end.t - self.t0, step.t1 - step.t0, n, index < self.warmup, wait_q, step_q
        )
        self.rows.append(row)
        self._held.append((row, step, end))

    def _release(self, final: bool) -> list[tuple[StepRow, list[PhaseRow]]]:
        """Held steps, in order, once the device has reached each of their events (the start-up module writes
        an event's time when the device gets there, after the call's own record)."""
        out: list[tuple[StepRow, list[PhaseRow]]] = []
        proc, held = self.proc, self._held
        while held:
            row, step, end = held[0]
            if not final and proc.dev_off is None and any(m not in proc.dev for m in step.marks(end)):
                break
            held.popleft()
            out.append((row, _phases(row.step, step, end, proc, self.t0)))
        return out

    def figures(self) -> dict[str, Any]:
        """This process's measured step figures (the per-rank row of a launcher's job)."""
        rows = [r for r in self.rows if not r.warmup]
        wall = sum(r.t_end - r.t_start for r in rows)
        counted = [r.samples for r in rows if r.samples is not None]
        lo = self.proc.loaders.get(self.proc.training or 0)
        return {
            "rank": self.proc.rank,
            "pid": self.proc.pid,
            "steps": len(rows),
            "step_time_ms": wall / len(rows) * 1e3 if rows else None,
            "data_wait_ms": sum(r.data_wait_s for r in rows) / len(rows) * 1e3 if rows else None,
            "throughput_samples_per_s": sum(counted) / wall
            if rows and wall > 0 and len(counted) == len(rows)
            else None,
            "loader_site": lo.site if lo else None,
        }


def handed_over(rec: dict[str, Any]) -> list[tuple[int, int, float, float, float]]:
    """A window the start-up module handed over as kineto's trace: its activities on the script's perf_counter
    (launch -1: not known); the trace is removed once read, but for the first window's
    (profiler/core/kernel_windows/trace_file)."""
    path = Path(str(rec["trace"]))
    wall_ref, clock_ref = int(rec["wall_ref"]), float(rec["clock_ref"])
    try:
        acts = activities(json.loads(path.read_bytes()), lambda ns: clock_ref + (ns - wall_ref) / 1e9)
    except (OSError, ValueError):
        return []
    if int(rec["w"]) >= KEEP:
        path.unlink(missing_ok=True)
    return [(s, k, a, b, -1.0 if math.isnan(c) else c) for s, k, a, b, c in acts]


class InstrumentReader:
    """Tails the start-up module's files in ``directory``; :meth:`poll` returns the run's steps completed since
    (the source process's); every other process with a training loader is built too, for its own figures."""

    def __init__(self, directory: Path, t0: float, warmup: int = WARMUP_STEPS) -> None:
        self.directory = directory
        self.t0 = t0
        self.warmup = warmup
        self.processes: dict[int, Process] = {}
        self.builders: dict[int, StepBuilder] = {}
        self.source: Process | None = None  # the process whose training loader makes the run's steps
        self._windows_taken = 0  # the source process's kernel windows handed out

    @property
    def batches(self) -> int:
        """Batches returned so far by any loader of any process."""
        return sum(lo.calls for p in self.processes.values() for lo in p.loaders.values())

    @property
    def steps(self) -> int:
        """Steps the run has (the source process's)."""
        return self.builders[self.source.pid].steps if self.source is not None else 0

    def poll(self, final: bool = False, early: bool = False) -> list[tuple[StepRow, list[PhaseRow]]]:
        """The run's steps completed since the last poll; ``final``: the last poll, nothing held back; ``early``
        (with ``final``): the command ended early, and a loader with EARLY_CALLS calls may be the training one."""
        self._read()
        least = EARLY_CALLS if final and early else LOCK_CALLS
        ready = [p for p in self.processes.values() if p.choose_training(least) is not None]
        source = self._source(ready)
        out: list[tuple[StepRow, list[PhaseRow]]] = []
        for proc in ready:
            built = self.builders.setdefault(proc.pid, StepBuilder(proc, self.t0, self.warmup)).build(final)
            if proc is source:
                out = built
        return out

    def take_windows(self) -> list[KernelWindow]:
        """The source process's kernel windows recorded since the last call, on the run's clock."""
        proc = self.source
        if proc is None or self._windows_taken >= len(proc.windows):
            return []
        new, self._windows_taken = proc.windows[self._windows_taken :], len(proc.windows)
        return [self._window(w) for w in new]

    def _window(self, w: dict[str, Any]) -> KernelWindow:
        """A ``kwin`` record on the run's clock; ``r``: where its recorded calls ended, its stop running on after
        them on the window thread (the activities launched after it are dropped)."""
        t0 = self.t0
        rec_end = float(w["r"]) - t0 if "r" in w else math.nan
        acts = [(int(a[0]), int(a[1]), a[2] - t0, a[3] - t0, a[4] - t0 if a[4] >= 0 else math.nan)
                for a in (handed_over(w) if "trace" in w else w["acts"])]  # fmt: skip
        return KernelWindow(int(w["w"]), float(w["t0"]) - t0, float(w["t1"]) - t0, float(w["cost"]),
                            acts if math.isnan(rec_end) else recorded(acts, rec_end), rec_end)  # fmt: skip

    def _read(self) -> None:
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return
        for name in names:
            if not (name.startswith("p") and name.endswith(".jsonl") and name[1:-6].isdigit()):
                continue
            pid = int(name[1:-6])
            proc = self.processes.setdefault(pid, Process(pid))
            try:
                with open(self.directory / name, "rb") as fh:
                    fh.seek(proc.offset)
                    data = fh.read()
            except OSError:
                continue
            whole = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
            proc.offset += len(whole)
            for line in whole.splitlines():
                try:
                    proc.take(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    continue  # a damaged line costs that record only

    def _source(self, candidates: list[Process]) -> Process | None:
        """The process whose steps are the run's, once one qualifies (``candidates``: those with a training loader)."""
        if self.source is None:
            if any(p.rank is not None for p in self.processes.values()):  # a launcher's ranks: rank 0's, once ready
                candidates = [p for p in candidates if p.rank == 0]
            ranked = sorted(candidates, key=lambda p: -p.loaders[p.training or 0].calls)
            self.source = ranked[0] if ranked else None
        return self.source

    def facts(self) -> dict[str, Any]:
        """What the run's meta keeps: every loader, the training one, and the knobs the report quotes."""
        loaders = [lo for p in self.processes.values() for lo in p.loaders.values()]
        out: dict[str, Any] = {
            "instrumented_processes": len([p for p in self.processes.values() if p.info]),
            "loaders": [lo.to_meta() for lo in loaders],
        }
        firsts = [float(r["t1"]) for p in self.processes.values() for r in p.records[:50] if r["k"] == "next"]
        if firsts:
            out["first_batch_s"] = min(firsts) - self.t0
        stops = sorted({p.stopped for p in self.processes.values() if p.stopped})
        if stops:
            out["trial_stop"] = stops[0]
        asides = sorted({p.aside for p in self.processes.values() if p.aside})
        if asides:
            out["instrument_aside"] = asides
        if self.source is not None and self.builders[self.source.pid].runq_seen:
            out["schedstat"] = "available"
        ranks = [b.figures() for b in self.builders.values() if b.proc.rank is not None]
        if ranks:
            out["rank_steps"] = sorted(ranks, key=lambda r: r["rank"])
        src = self.source
        if src is not None and src.device is not None:
            index = src.device["index"]
            out["device"] = {
                "kind": "cuda",
                "torch_device": f"cuda:{index}",
                "name": src.device["name"],
                "index": index,
            }
            out["device_timer"] = "cuda-events"
            if src.dev_off:
                out["device_timer_off"] = src.dev_off
        if src is not None and src.training is not None:
            lo = src.loaders[src.training]
            out["training_loader"] = lo.to_meta()
            if (ray := src.ray_stats.get(src.training)) is not None:  # the report's Ray view (analysis.ray_view)
                out["training_loader"]["ray_stats"] = ray
            out["loader_site"] = lo.site
            out.update(_knob_facts(lo.args), pipeline=_pipeline(lo.kind))
            most = max(src.loaders.values(), key=lambda x: x.calls)
            if lo.calls < LOCK_CALLS:
                out["instrument_note"] = (
                    f"the command ended after {lo.calls} batches of the loader at {lo.site}, before any loader had "
                    f"the {LOCK_CALLS} that pick the training loader: the steps that ran are that loader's"
                )
            elif most.id != lo.id:
                out["instrument_note"] = (
                    f"the loader at {most.site} ended with more next() calls ({most.calls}) than the one taken as "
                    f"training at {lo.site} ({lo.calls}), which reached {LOCK_CALLS} calls first"
                )
        return out


@dataclass
class _OpenStep:
    t0: float
    t1: float  # the batch arrived
    samples: object
    q0: object  # the training thread's run-queue wait (ns) at the step's start, and when its batch arrived
    q1: object
    m1: object = None  # the device event recorded as the batch arrived (on CUDA)
    others: list[dict[str, Any]] = field(default_factory=list)

    def marks(self, end: _Edge) -> list[int]:
        """The device events the step's phases start and end at."""
        found = [self.m1, end.m] + [r.get(k) for r in self.others if r["k"] in ("next", "end") for k in ("m0", "m1")]
        return [m for m in found if isinstance(m, int)]


@dataclass(frozen=True, slots=True)
class _Edge:
    """A point of a step: its host time, the run-queue reading there and the device event recorded there."""

    t: float
    q: object = None
    m: object = None


def _ns_between(a: object, b: object) -> float | None:
    """Seconds between two run-queue readings in ns; None when either is missing."""
    if isinstance(a, int) and isinstance(b, int) and b >= a:
        return (b - a) / 1e9
    return None


def _phases(index: int, step: _OpenStep, end: _Edge, proc: Process, base: float) -> list[PhaseRow]:
    """Other loaders iterated in the step (one phase each), and the rest after the batch arrived: compute (with
    its run-queue wait when it is one piece), each with the device times of its events where it has both."""
    spans: dict[int, tuple[_Edge, _Edge]] = {}
    for rec in step.others:
        if rec["k"] in ("next", "end"):
            a, b = _Edge(float(rec["t0"]), m=rec.get("m0")), _Edge(float(rec["t1"]), m=rec.get("m1"))
            lo, hi = spans.get(int(rec["id"]), (a, b))
            spans[int(rec["id"])] = (lo if lo.t <= a.t else a, hi if hi.t >= b.t else b)
    out = []
    cursor = _Edge(step.t1, m=step.m1)
    for lid, (first, last) in sorted(spans.items(), key=lambda kv: kv[1][0].t):
        a = first if first.t > cursor.t else cursor
        b = last if last.t < end.t else end
        if b.t <= a.t:
            continue
        out.append(_phase(index, "compute", cursor, a, proc=proc, base=base))
        loader = proc.loaders.get(lid)
        out.append(_phase(index, f"loader {loader.site if loader else lid}", a, b, proc=proc, base=base))
        cursor = b
    runq = _ns_between(step.q1, end.q) if not out else None
    out.append(_phase(index, "compute", cursor, end, proc=proc, base=base, runq=runq))
    return [p for p in out if p.t_end > p.t_start]


def _phase(
    index: int, name: str, a: _Edge, b: _Edge, *, proc: Process, base: float, runq: float | None = None
) -> PhaseRow:
    """A top-level phase from ``a`` to ``b``; its device times where the device reached both their events."""
    d0 = proc.dev.get(a.m) if isinstance(a.m, int) else None
    d1 = proc.dev.get(b.m) if isinstance(b.m, int) else None
    if d0 is None or d1 is None:
        return PhaseRow(index, name, 0, a.t - base, b.t - base, runq_s=runq)
    return PhaseRow(index, name, 0, a.t - base, b.t - base, d0 - base, d1 - base, runq)


def _pipeline(kind: str) -> str:
    """The run's pipeline name for the training loader's kind (the start-up module's ``kind``)."""
    if kind.startswith("DALI"):
        return "DALI"
    return "torchdata.nodes" if kind.startswith("torchdata") else "DataLoader"


def _knob_facts(args: Mapping[str, Any]) -> dict[str, Any]:
    """The loader's knobs under the names every run's meta uses."""
    out: dict[str, Any] = {}
    knobs = (
        ("num_workers", "workers"),
        ("num_threads", "workers"),
        ("pin_memory", "pin_memory"),
        ("batch_size", "batch_size"),
    )
    for key, name in knobs:
        if isinstance(args.get(key), (int, bool)):
            out[name] = args[key]
    return out
