"""Zero-code profiling: run (or attach to) an unmodified training process and record it from outside.

What is recorded: the background sampler on the target's process tree (host) and NVML, into the same run
store as an instrumented run, plus py-spy's stacks of the target and its DataLoader workers in
``RUN_DIR/pyspy.txt``. What is not: step boundaries and phase times, which only instrumentation sees; the
summary says so rather than guess, and estimates the data-wait fraction from the main thread's stacks.

Invariants: the target's output reaches the user unchanged (on stderr when stdout must hold JSON); its
exit code is recorded; a py-spy that cannot attach leaves a sampler-only run that still completes, with
the reason and its fix in the store and on stderr. The store is closed whatever happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from profiler.pyspy import DEFAULT_RATE, OUTPUT, PySpyRecorder
from profiler.sampler import Sampler
from profiler.session import Interrupted, write_summary
from profiler.store import RunStore, pid_alive


@dataclass(frozen=True, slots=True)
class ZeroCodeResult:
    run_dir: Path
    exit_code: int | None  # the command's exit code; None when attached to a process we did not start
    pyspy_problem: str | None
    status: str


Monitor = Callable[[Path], AbstractContextManager[Any]]


def profile_external(
    out: Path,
    *,
    command: list[str] | None = None,
    pid: int | None = None,
    sample_hz: float = 10.0,
    pyspy_rate: int = DEFAULT_RATE,
    duration_s: float | None = None,
    child_stdout: IO[Any] | int | None = None,
    monitor: Monitor | None = None,
    warn: Callable[[str], None] = lambda msg: print(f"stallscope: {msg}", file=sys.stderr),
) -> ZeroCodeResult:
    """Profile ``command`` (started here) or ``pid`` (already running) until it exits or ``duration_s``."""
    if (command is None) == (pid is None):
        raise ValueError("give exactly one of command or pid")
    from profiler.sources.host import HostSource
    from profiler.sources.nvml import NvmlSource
    from profiler.sources.sched import SchedSource

    t0 = time.perf_counter()
    child: subprocess.Popen[bytes] | None = None
    if command is not None:
        try:
            child = subprocess.Popen(command, stdout=child_stdout)
        except OSError as exc:
            raise FileNotFoundError(f"cannot start {command[0]!r}: {exc.strerror or exc}") from None
        pid = child.pid
    assert pid is not None
    sites = _copy_sites(command)
    store = RunStore(
        out,
        meta={
            "mode": "zero-code",
            "scenario": Path(command[1]).name if command and len(command) > 1 else f"pid {pid}",
            "command": command,
            "target_pid": pid,
            "status": "running",
            "pid": os.getpid(),
            "started_at": time.time(),
            "heartbeat": time.time(),
            "sample_hz": sample_hz,
            "pyspy_rate": pyspy_rate,
            "h2d_sites": sites,
            "cpu_count": os.cpu_count(),
            "device": {"kind": "unknown", "name": "chosen by the profiled program", "torch_device": "?"},
        },
    )
    host = HostSource(pid)
    sampler = Sampler(
        [host, SchedSource(pid, workers=host.pid_labels), NvmlSource()],
        sample_hz,
        sink=store.put_samples,
        on_event=store.put_event,
        t0=t0,
    )
    recorder = PySpyRecorder(pid, out / OUTPUT, rate=pyspy_rate)
    exit_code: int | None = None
    status, error = "complete", None
    problem: str | None = None
    try:
        sampler.start()
        problem = recorder.start()
        store.put_meta(pyspy_started_at=recorder.started_at, pyspy_args=recorder.args)
        if problem:
            store.put_event(time.perf_counter() - t0, "warning", problem, "pyspy")
            warn(f"{problem}; the run goes on with the host and NVML sampler only")
        with monitor(out) if monitor else nullcontext():
            exit_code = _wait(child, pid, duration_s)
        if exit_code:
            status, error = "failed", f"the command exited with code {exit_code}"
    except (KeyboardInterrupt, Interrupted) as exc:
        status, error = "interrupted", f"stopped by {getattr(exc, 'signame', 'SIGINT')}"
        if child is not None:
            exit_code = _reap(child)
    finally:
        sampler.stop()  # first: the target is gone, and a read of its process tree now only reports that
        stop_problem = recorder.stop()
        if stop_problem and not problem:
            problem = stop_problem
            store.put_event(time.perf_counter() - t0, "warning", stop_problem, "pyspy")
            warn(stop_problem)
        store.put_meta(
            status=status,
            error=error,
            command_exit_code=exit_code,
            ended_at=time.time(),
            pyspy_stopped_at=recorder.stopped_at,
            pyspy_problem=problem,
            sampler_stats=sampler.stats.to_meta(),
        )
        store.close()
        write_summary(out)
    return ZeroCodeResult(out, exit_code, problem, status)


def _copy_sites(command: list[str] | None) -> list[list[Any]]:
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


def _wait(child: subprocess.Popen[bytes] | None, pid: int, duration_s: float | None) -> int | None:
    deadline = None if duration_s is None else time.monotonic() + duration_s
    while True:
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
