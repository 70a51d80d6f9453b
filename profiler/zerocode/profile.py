"""Zero-code profiling: run (or attach to) an unmodified training process and record it from outside.

What is recorded: the background sampler on the target's process tree (host) and NVML, into the same run
store as an instrumented run, plus py-spy's stacks of the target and its DataLoader workers in
``RUN_DIR/pyspy.txt``. A command started here also loads the start-up module that times its DataLoaders
(:mod:`profiler.zerocode.instrument`): its steps go into the store as a Session's do, and the run's mode
becomes ``auto-instrumented``. Without them (``attach``, ``--no-instrument``, a script that iterates no
DataLoader) there are no step boundaries: the summary says so rather than guess, and estimates the
data-wait fraction from the main thread's stacks.

Invariants: the target's output reaches the user unchanged (on stderr when stdout must hold JSON); its
exit code is recorded; a py-spy that cannot attach leaves a sampler-only run that still completes, with
the reason and its fix in the store and on stderr. The store is closed whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from profiler.analysis.meta import AUTO_INSTRUMENTED
from profiler.core.recorders.in_thread import ThreadRecorder, default_sources, log_warning
from profiler.core.sampling.pyspy import DEFAULT_RATE
from profiler.core.session import Interrupted
from profiler.core.sources.ranks import RankMeta, RankSource
from profiler.core.store import pid_alive
from profiler.live.feeds import Monitor, StoreFeed
from profiler.runs.session import full_summary
from profiler.runs.summarize import summarize_run
from profiler.zerocode.instrument import LOCK_CALLS, InstrumentReader, TrialStop, child_env

INSTRUMENT_DIR = "instrument"  # in the run directory: the start-up module's records, as it wrote them
PYSPY_UNAVAILABLE = "{problem}; the run goes on with the host and NVML sampler only"
COMMAND_LOG = "command.log"  # in a trial's run directory: the command's own output

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.zerocode.analysis import ZeroCodeJob


@dataclass(frozen=True, slots=True)
class ZeroCodeResult:
    run_dir: Path
    exit_code: int | None  # the command's exit code; None when attached to a process we did not start
    pyspy_problem: str | None
    status: str
    summary: Summary | None  # built once at close (None only if it could not be built)
    job: ZeroCodeJob | None = None  # the ranks, when the command was a launcher (torchrun) of several
    error: str | None = None
    left_behind: int = 0  # a trial's processes still alive when its command ended (then killed)
    step_s: tuple[float, ...] = ()  # the measured (not warm-up) steps' durations, when instrumented
    facts: dict[str, Any] = field(default_factory=dict)  # the start-up module's facts (loaders, trial_stop)
    ran_s: float | None = None  # from the start to the command's end or the stop (the close not counted)


@dataclass(frozen=True, slots=True)
class CommandTrial:
    """A tuning trial of a command: its DataLoaders' knobs overridden, its process stopped by the start-up module
    (``stop``), in a process group of its own that is ended with it. ``first_batch_s``: the command must return
    its first batch within this many seconds of its start; ``limit_s``: and end within this."""

    overrides: dict[str, object]
    stop: TrialStop
    first_batch_s: float
    limit_s: float
    stop_requested: Callable[[], str | None] | None = None  # a signal the caller received: end the trial now


def profile_external(
    out: Path,
    *,
    command: list[str] | None = None,
    pid: int | None = None,
    sample_hz: float = 10.0,
    pyspy_rate: int = DEFAULT_RATE,
    duration_s: float | None = None,
    child_stdout: IO[str] | IO[bytes] | int | None = None,
    monitor: Monitor | None = None,
    warn: Callable[[str], None] = log_warning,
    instrument: bool = False,
    trial: CommandTrial | None = None,
) -> ZeroCodeResult:
    """Profile ``command`` (started here) or ``pid`` (already running) until it exits or ``duration_s``.

    ``instrument``: start ``command`` with the start-up module that times its DataLoaders
    (:mod:`profiler.zerocode.instrument`); its steps are recorded as a Session's are. ``trial``: run it as a
    tuning trial (instrumented, no py-spy, its output to ``RUN_DIR/command.log``; see :class:`CommandTrial`)."""
    if (command is None) == (pid is None):
        raise ValueError("give exactly one of command or pid")
    t0 = time.perf_counter()
    reader = _instrumented(out, t0) if (instrument or trial) and command is not None else None
    child = _launch(out, command, child_stdout, reader, trial)
    target = child.pid if child is not None else pid
    assert target is not None
    # a launcher's ranks (torchrun --nproc-per-node N) are found from their environment as they start
    ranks = RankSource(target)
    rec = ThreadRecorder(
        out, meta=_meta(command, target, pyspy_rate), sample_hz=sample_hz,
        sources=[*default_sources(target), ranks], warn=warn, summarize=summarize_run,
    )  # fmt: skip
    tick = _Tick(rec, _RankNotes(rec, ranks), reader)
    exit_code: int | None = None
    status, error = "complete", None
    left = 0
    ran_s: float | None = None
    try:
        rec.start(t0=t0)
        if trial is None:  # a trial's throughput is what it measures: py-spy's cost would be in it
            rec.start_pyspy(target, rate=pyspy_rate, attach_timeout_s=3.0, unavailable=PYSPY_UNAVAILABLE)
        watch = _Watch(trial, reader, t0) if trial is not None else None
        with monitor(StoreFeed(out)) if monitor else nullcontext():
            exit_code = _wait(child, target, duration_s, tick, watch)
        ran_s = time.perf_counter() - t0
        status, error = _ended(watch, exit_code)
    except (KeyboardInterrupt, Interrupted) as exc:
        ran_s = time.perf_counter() - t0
        status, error = "interrupted", f"stopped by {getattr(exc, 'signame', 'SIGINT')}"
        if child is not None and trial is None:
            exit_code = _reap(child)
    finally:
        if child is not None and trial is not None:
            left = end_group(child)
        # a command that ended early keeps the steps that ran, however few (a trial needs its loader told apart)
        tick.last(early=trial is None and (status == "interrupted" or bool(exit_code)))
        summary = full_summary(
            rec.close(status, error, command_exit_code=exit_code, **({"left_behind": left} if trial else {}))
        )
    return replace(_result(rec, reader, summary, exit_code, status=status, error=error, left=left), ran_s=ran_s)


def _launch(
    out: Path,
    command: list[str] | None,
    child_stdout: IO[str] | IO[bytes] | int | None,
    reader: InstrumentReader | None,
    trial: CommandTrial | None,
) -> subprocess.Popen[bytes] | None:
    """The command started (None when attaching), with the start-up module's environment when instrumented."""
    if command is None:
        return None
    env = None
    if reader is not None and trial is not None:
        env = child_env(reader.directory, overrides=trial.overrides, stop=trial.stop)
    elif reader is not None:
        env = child_env(reader.directory)
    return _start(command, child_stdout, env, trial is not None, out)


def _ended(watch: _Watch | None, exit_code: int | None) -> tuple[str, str | None]:
    """The run's status and error once the wait ended: a trial's limits, else the command's exit code."""
    if watch is not None and watch.signame:
        return "interrupted", f"stopped by {watch.signame}"
    if watch is not None and watch.why:
        return "failed", watch.why
    if exit_code:
        return "failed", f"the command exited with code {exit_code}"
    return "complete", None


def _result(
    rec: ThreadRecorder,
    reader: InstrumentReader | None,
    summary: Summary | None,
    exit_code: int | None,
    *,
    status: str,
    error: str | None,
    left: int,
) -> ZeroCodeResult:
    job = _job(rec, summary)
    steps = rec.store.record().steps if rec.store is not None and reader is not None else []
    step_s = tuple(r.t_end - r.t_start for r in steps if not r.warmup)
    facts = _instrument_facts(reader) if reader is not None else {}
    return ZeroCodeResult(rec.out_dir, exit_code, rec.pyspy_problem, status, summary, job, error, left, step_s, facts)


def _job(rec: ThreadRecorder, summary: Summary | None) -> ZeroCodeJob | None:
    """The job view of a run that found ranks; its keys join summary.json (the single-run keys stay as they are)."""
    from profiler.zerocode.analysis import zero_code_job

    if rec.store is None or summary is None:
        return None
    job = zero_code_job(rec.store.record())
    if job is not None:
        (rec.out_dir / "summary.json").write_text(json.dumps(job.summary_dict(summary), indent=2) + "\n")
    return job


def _instrumented(out: Path, t0: float) -> InstrumentReader:
    directory = out / INSTRUMENT_DIR
    directory.mkdir(parents=True, exist_ok=True)
    return InstrumentReader(directory, t0)


def _instrument_facts(reader: InstrumentReader) -> dict[str, object]:
    """The meta of an instrumented run: its loaders, and the mode its figures have (measured steps or not)."""
    facts = reader.facts()
    source = reader.source
    if source is not None and (source.windows or source.windows_off):
        off = f"; stopped: {source.windows_off}" if source.windows_off else ""
        facts["kernel_windows"] = f"cupti: {len(source.windows)} window(s) from the start-up module{off}"
    if reader.steps:
        return {**facts, "mode": AUTO_INSTRUMENTED, "warmup_steps": reader.warmup}
    if not facts["instrumented_processes"]:
        why = "no Python process of the command loaded it (python -I / -S, or a PYTHONPATH the command resets)"
    elif facts.get("instrument_aside"):
        why = "; ".join(facts["instrument_aside"])
    else:
        why = f"no DataLoader was iterated {LOCK_CALLS} times"
    return {**facts, "instrument_note": f"the start-up module measured no step: {why}"}


@dataclass
class _Tick:
    """What the wait loop does each tick: keep the ranks seen, move the start-up module's steps into the store."""

    rec: ThreadRecorder
    note_ranks: _RankNotes
    reader: InstrumentReader | None

    def __call__(self, final: bool = False, early: bool = False) -> None:
        self.note_ranks()
        if self.reader is not None:
            for row, phases in self.reader.poll(final, early):
                self.rec.on_step(row, phases)
            for window in self.reader.take_windows():
                self.rec.on_window(window)

    def last(self, early: bool = False) -> None:
        """The last tick, before the store closes (nothing held back for device times), and the instrumented
        run's facts into its meta; ``early``: the command ended early (see InstrumentReader.poll)."""
        self(final=True, early=early)
        if self.reader is not None:
            self.rec.annotate(**_instrument_facts(self.reader))


def _start(
    command: list[str],
    child_stdout: IO[str] | IO[bytes] | int | None,
    env: dict[str, str] | None,
    trial: bool,
    out: Path,
) -> subprocess.Popen[bytes]:
    """The command, as a trial in its own process group with its output in ``out/command.log``."""
    try:
        if not trial:
            return subprocess.Popen(command, stdout=child_stdout, env=env)
        with open(out / COMMAND_LOG, "wb") as log:
            return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, process_group=0)
    except OSError as exc:
        raise FileNotFoundError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None


def end_group(child: subprocess.Popen[bytes], grace_s: float = 5.0) -> int:
    """End a trial's process group: the command itself if still running (SIGTERM, then SIGKILL after
    ``grace_s``), and anything of its group left behind (DataLoader workers orphaned by a crash). The number of
    the group's processes that were still alive once the command had ended."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    left = group_members(child.pid)
    if left:
        with suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while group_members(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if group_members(child.pid):
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
    return len(left)


def group_members(pgid: int) -> list[int]:
    """Live processes (not zombies) whose process group is ``pgid``, from /proc."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != b"Z":
            out.append(int(entry.name))
    return out


@dataclass
class _Watch:
    """A trial's limits, checked each tick: its first batch within ``first_batch_s``, its end within ``limit_s``."""

    trial: CommandTrial
    reader: InstrumentReader | None
    t0: float
    why: str | None = None
    signame: str | None = None

    def __call__(self) -> bool:
        """True when the trial must be ended now (``why`` or ``signame`` says why)."""
        asked = self.trial.stop_requested
        self.signame = asked() if asked is not None else None
        if self.signame:
            return True
        elapsed = time.perf_counter() - self.t0
        batches = self.reader.batches if self.reader is not None else 0
        if batches == 0 and elapsed > self.trial.first_batch_s:
            self.why = f"no DataLoader returned a batch within {self.trial.first_batch_s:.0f} s of the start"
        elif elapsed > self.trial.limit_s:
            self.why = f"the command did not end within {self.trial.limit_s:.0f} s (its trial's limit)"
        return self.why is not None


def _meta(command: list[str] | None, pid: int, pyspy_rate: int) -> dict[str, object]:
    return {
        "mode": "zero-code",
        "scenario": _script_name(command) if command and len(command) > 1 else f"pid {pid}",
        "command": command,
        "target_pid": pid,
        "pyspy_rate": pyspy_rate,
        "h2d_sites": _copy_sites(command),
        "cpu_count": os.cpu_count(),
        "device": {"kind": "unknown", "name": "chosen by the profiled program", "torch_device": "?"},
    }


def _script_name(command: list[str]) -> str:
    """The first ``.py`` argument's name (``torchrun --nproc-per-node 2 train.py`` -> ``train.py``), else the
    first argument's."""
    return next((Path(a).name for a in command[1:] if a.endswith(".py")), Path(command[1]).name)


def _copy_sites(command: list[str] | None) -> list[list[str | int]]:
    """Lines of the profiled script that copy to a device: the only way to see .to()/.cuda() in stacks,
    since C calls leave no Python frame. Empty when the command is not ``python SCRIPT.py``."""
    from profiler.analysis.attribution import find_copy_sites

    script = next((Path(a) for a in (command or [])[1:] if a.endswith(".py")), None)
    if script is None or not script.is_file():
        return []
    try:
        sites = find_copy_sites(script.read_text(errors="replace"), script.name)
    except ValueError:
        return []
    return [list(s) for s in sorted(sites)]


@dataclass
class _RankNotes:
    """Keeps the ranks seen so far in the run's meta (``ranks``) as they appear, so a killed run has them."""

    rec: ThreadRecorder
    source: RankSource
    written: list[RankMeta] = field(default_factory=list)

    def __call__(self) -> None:
        found = [r.to_meta() for r in self.source.ranks()]
        if found and found != self.written:
            self.rec.annotate(ranks=found)
            self.written = found


def _wait(
    child: subprocess.Popen[bytes] | None,
    pid: int,
    duration_s: float | None,
    tick: Callable[[], None],
    watch: Callable[[], bool] | None = None,
) -> int | None:
    deadline = None if duration_s is None else time.monotonic() + duration_s
    while True:
        tick()
        if watch is not None and watch():
            return None
        if child is not None:
            code = child.poll()
            if code is not None:
                return code
        elif not pid_alive(pid):
            return None
        if deadline is not None and time.monotonic() >= deadline:
            return None
        time.sleep(0.1)


def _reap(child: subprocess.Popen[bytes]) -> int | None:
    """After Ctrl-C (which the terminal also sent to the child): give it a moment to exit on its own."""
    try:
        return child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.terminate()
        return child.wait()
