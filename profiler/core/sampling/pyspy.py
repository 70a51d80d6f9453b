"""Running py-spy beside a training process: attach, record to a file in the run directory, stop.

Its flags (10 Hz, ``--idle``, ``--subprocesses``, ``--format speedscope``; not ``--nonblocking``) and why:
docs/zero-code.md, "How the estimate is made" (measured with benchmarks/zerocode.py). It runs under
SCHED_FIFO where the host allows it (:class:`OnTime`), so that its samples are taken on time on a host
with no idle core.
Invariants: nothing here raises into the caller for a py-spy that is missing or cannot attach; ``start``
returns a reason with a fix instead, and the run goes on with the sampler alone. ``start`` returns as soon as
py-spy says it samples (its stdout is read to the end throughout). py-spy's stderr (its errors, with a Rust
backtrace where it fails) goes whole to ``LOG`` in the run directory, never to the terminal: a problem line quotes
its first message only and names the log. Once attached, a watcher thread reports a py-spy killed or failed
before ``stop`` once through ``on_exit``; ending with code 0 by itself (its target exited) is its normal end.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from profiler.core.store import STACKS_NAME

DEFAULT_RATE = 10
MAX_RATE = 1000
OUTPUT = STACKS_NAME
LOG = "pyspy.log"  # beside OUTPUT: py-spy's own stderr
FIFO_PRIORITY = 1  # the lowest real-time priority: ahead of every normal process, behind the kernel's threads
PROMOTE_AFTER_S = 0.5  # a py-spy thread's age before it runs real-time (see OnTime)
PROMOTE_EVERY_S = 0.2


class OnTime:
    """Moves each py-spy thread to SCHED_FIFO once it is PROMOTE_AFTER_S old, so that its samples are on time.

    A sampler at normal priority on a host with no idle core gets a CPU when the sampled thread gives one up,
    which it does when it blocks: its samples come late during the thread's computing and early in its waits,
    and the wait fraction reads high (docs/zero-code.md: +4 points at a true 85%, two busy processes beside
    the job). Real-time py-spy wakes when its clock says. Not from the start: a py-spy thread that opens a
    process just started retries five times 20 ms apart and then gives that process up for good; at normal
    priority, as py-spy is built to run, the process's own start-up has time to finish. So every thread starts
    normal (``SCHED_RESET_ON_FORK``: the threads a promoted one starts do too) and is promoted when it is
    older. Without the privilege (CAP_SYS_NICE or RLIMIT_RTPRIO) nothing changes and ``scheduling`` says so.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.scheduling = f"SCHED_FIFO {FIFO_PRIORITY}, each thread from {PROMOTE_AFTER_S:g} s after it starts"
        self.promoted: set[int] = set()
        self._seen: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallscope-pyspy-ontime", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        while not self._stop.wait(PROMOTE_EVERY_S):
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{self.pid}/task")]
            except OSError:
                return  # py-spy has exited
            if not self.promote_due(tids, time.monotonic()):
                return

    def promote_due(self, tids: list[int], now: float) -> bool:
        """Promote the threads old enough; False once promoting is not allowed here (then nothing more is)."""
        for tid in tids:
            first = self._seen.setdefault(tid, now)
            if tid in self.promoted or now - first < PROMOTE_AFTER_S:
                continue
            try:
                os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(FIFO_PRIORITY))
            except ProcessLookupError:
                continue  # the thread ended
            except (AttributeError, OSError) as exc:  # not Linux, or not permitted
                reason = getattr(exc, "strerror", None) or type(exc).__name__
                self.scheduling = f"{NORMAL_PRIORITY} (SCHED_FIFO not allowed here: {reason})"
                return False
            self.promoted.add(tid)
        return True


NORMAL_PRIORITY = "normal priority"
# what py-spy record prints on stdout once it has opened the process (before that it prints nothing there), and
# when its schedule has slipped by over a second (it then takes the samples it missed back-to-back)
SAMPLING_LINE = b"Sampling process"
BEHIND = re.compile(rb"([0-9.]+)s behind in sampling")  # past 1 s, so always in seconds ("1.23s")


class PySpyOut:
    """Reads py-spy's stdout to its end, so that its notes never fill the pipe and stall it: ``attached`` is set
    at its "Sampling process ..." line, ``behind_s`` is the most it said it was behind its schedule (None: never
    said, which py-spy does only past 1 s) and ``behind_reports`` how often it said so."""

    def __init__(self) -> None:
        self.attached = threading.Event()
        self.behind_s: float | None = None
        self.behind_reports = 0

    def read(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            if SAMPLING_LINE in line:
                self.attached.set()
            elif (m := BEHIND.search(line)) is not None:
                self.behind_reports += 1
                self.behind_s = max(self.behind_s or 0.0, float(m.group(1)))


def find_pyspy() -> str | None:
    """$STALLSCOPE_PYSPY if set, else the py-spy next to this interpreter (a venv), else on PATH."""
    override = os.environ.get("STALLSCOPE_PYSPY")
    if override:
        return override if os.path.exists(override) else None
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def first_message(stderr: str) -> str:
    """py-spy's error message on one line, without the Rust backtrace it adds ("Stack backtrace: 0: anyhow::...")."""
    return " ".join(stderr.split("Stack backtrace:", 1)[0].split())


def target_gone(pid: int) -> bool:
    """The process has exited (a zombie not yet reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except (OSError, IndexError):
        return not os.path.exists(f"/proc/{pid}")


def attach_problem(stderr: str, log: Path | None = None) -> str:
    """Turn py-spy's failure output into one line saying why and how to fix it (``log``: where its output is)."""
    low = " ".join(stderr.split()).lower()
    text = first_message(stderr)
    line = _attach_problem(text, low)
    return f"{line} (py-spy's output: {log})" if log is not None and text else line


NO_PROCESS = "the process exited before py-spy could attach"


def _attach_problem(text: str, low: str) -> str:
    if "permission denied" in low or "operation not permitted" in low or "eperm" in low:
        return (
            f"py-spy cannot read the process ({text[:160]}): run stallscope as root, or allow ptrace with "
            "`sudo sysctl kernel.yama.ptrace_scope=0`; in Docker add `--cap-add SYS_PTRACE`"
        )
    if "failed to find python version" in low or "not a python" in low:
        return f"py-spy found no Python interpreter in the process ({text[:160]}): is the command a Python program?"
    if "no such process" in low:
        return NO_PROCESS
    return f"py-spy failed: {text[:200]}" if text else "py-spy exited without output"


def exit_problem(returncode: int, stderr: str, at_s: float, log: Path | None = None) -> str:
    """One line for a py-spy that ended by itself mid-run: when, and killed by what or failing how."""
    if returncode < 0:
        try:
            how = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            how = f"killed by signal {-returncode}"
    else:
        text = first_message(stderr)
        how = f"exited with code {returncode}" + (f": {text[:160]}" if text else "")
        how += f"; its output: {log}" if log is not None and text else ""
    return f"py-spy stopped at {at_s:.1f} s ({how}); its stack samples are lost"


@dataclass
class PySpyRecorder:
    """One ``py-spy record`` attached to ``pid`` and its subprocesses, writing ``out``."""

    pid: int
    out: Path
    rate: int = DEFAULT_RATE
    exe: str | None = None
    proc: subprocess.Popen[bytes] | None = None
    problem: str | None = None
    started_at: float | None = None
    stopped_at: float | None = None
    args: list[str] = field(default_factory=list)
    on_time: OnTime | None = None  # what py-spy runs under: ``on_time.scheduling``; None before start
    now: Callable[[], float] | None = None  # the run's seconds, to say when py-spy stopped (default: since start)
    on_exit: Callable[[str], None] | None = None  # told once, from the watcher, when py-spy ends before stop()
    log: Path | None = None  # where py-spy's stderr goes (None: LOG beside ``out``)
    gone: bool = False  # its target had exited when it failed to attach (then that is no news of py-spy's)
    _stopping: bool = field(default=False, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    stdout: PySpyOut = field(default_factory=PySpyOut, init=False, repr=False)  # attached; how far behind it fell
    _watcher: threading.Thread | None = field(default=None, init=False, repr=False)
    _reader: threading.Thread | None = field(default=None, init=False, repr=False)

    def start(self, attach_timeout_s: float = 3.0) -> str | None:
        """Attach; None when recording, else the reason (and fix) it is not."""
        if not 1 <= self.rate <= MAX_RATE:
            raise ValueError(f"py-spy rate {self.rate} is out of range: allowed 1..{MAX_RATE}")
        exe = self.exe or find_pyspy()
        if exe is None:
            self.problem = "py-spy is not installed: `pip install py-spy` (it ships a static binary)"
            return self.problem
        self.args = [
            exe, "record", "--pid", str(self.pid), "--subprocesses", "--idle", "--threads",
            "--rate", str(self.rate), "--format", "speedscope", "--output", str(self.out),
        ]  # fmt: skip
        # py-spy prints its failures on stderr, with a Rust backtrace: into the log, never to the user's terminal
        self.log = self.log or self.out.with_name(LOG)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=log)
        self.on_time = OnTime(self.proc.pid)
        self.on_time.start()
        self.started_at = time.time()
        self._reader = threading.Thread(target=self._read_stdout, args=(self.proc,), name="stallscope-pyspy-out")
        self._reader.daemon = True
        self._reader.start()
        attached, deadline = self.stdout.attached, time.monotonic() + attach_timeout_s
        # until py-spy says it samples (it has opened the process), it exits (it could not) or the time is up
        while not attached.is_set() and time.monotonic() < deadline:
            if (returncode := self.proc.poll()) is not None:
                err = self._stderr()
                self.gone = target_gone(self.pid)
                # killed (by a signal) while attaching says so; else py-spy's own output says why it could not
                if returncode < 0:
                    self.problem = exit_problem(returncode, err, self._at())
                elif self.gone:  # whatever py-spy says of a process that is no more ("No python processes found")
                    self.problem = attach_problem("Error: No such process", self.log if err.strip() else None)
                else:
                    self.problem = attach_problem(err, self.log)
                return self.problem
            attached.wait(0.05)
        self._watcher = threading.Thread(target=self._watch, args=(self.proc,), name="stallscope-pyspy", daemon=True)
        self._watcher.start()
        return None

    def _read_stdout(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stdout is not None:
            self.stdout.read(proc.stdout)  # until py-spy closes it, at its exit
            proc.stdout.close()

    @property
    def wrote_nothing(self) -> bool:
        return not (self.out.exists() and self.out.stat().st_size > 0)

    def _stderr(self) -> str:
        """What py-spy has written to its log (its first 64 KiB: the message comes first)."""
        try:
            with open(self.log or self.out.with_name(LOG), "rb") as fh:
                return fh.read(1 << 16).decode(errors="replace")
        except OSError:
            return ""

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        returncode = proc.wait()
        at_s = self._at()
        with self._lock:
            if self._stopping or returncode == 0:
                return
            self.problem = exit_problem(returncode, self._stderr(), at_s, self.log)
            self.stopped_at = time.time()
        if self.on_exit is not None:
            self.on_exit(self.problem)

    def _at(self) -> float:
        """Now, in the run's seconds (or seconds since py-spy started)."""
        if self.now is not None:
            return self.now()
        return time.time() - (self.started_at if self.started_at is not None else time.time())

    def stop(self, timeout_s: float = 20.0) -> str | None:
        """Let py-spy write its output and exit; returns a problem line if it could not."""
        with self._lock:
            self._stopping = True
        if self.proc is None or self.problem is not None:
            return self.problem
        if self.proc.poll() is None:
            # SIGINT is py-spy's "stop and write what you have"
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            self.problem = f"py-spy did not stop within {timeout_s:.0f} s and was killed; its samples are lost"
        self.stopped_at = time.time()
        if self.on_time is not None:
            self.on_time.stop()
        for reader in (self._watcher, self._reader):  # each ends once py-spy has exited and closed its stream
            if reader is not None:
                reader.join(timeout=5.0)
        if self.problem is None and self.wrote_nothing:
            self.problem = "py-spy wrote no samples (the process exited before the first sample?)"
        return self.problem
