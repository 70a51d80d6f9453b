"""Running py-spy beside a training process: attach, record to a file in the run directory, stop.

Design decisions (measured on the 2-core machine, see docs/zero-code.md and benchmarks/zerocode.py):
- ``--nonblocking``: py-spy does not pause the target to read its stacks. Pausing the main process and
  each worker 100 times a second cost 16-25% of throughput here; not pausing costs a little accuracy
  (a stack read while it changes), which the sample count's uncertainty dwarfs.
- A default rate of 10 Hz, not py-spy's 100: attached to a training script and its 2 workers here, py-spy
  itself used 7.3% of a core at 25 Hz and 3% at 10 Hz, CPU taken from training on a 2-core machine. The
  estimate's error is set by the number of samples (about 1/sqrt(n)): a 5-minute run gives 3,000 at 10 Hz.
- ``--idle``: a thread blocked on a queue (the main thread waiting for a batch) is exactly what must be
  counted; without it py-spy drops those samples.
- ``--subprocesses``: DataLoader workers are child processes.
- ``--format speedscope``: unlike the raw format it keeps each thread's samples in order, so estimates can
  be given per time window, not only for the whole run.

Invariants: nothing here raises into the caller for a py-spy that is missing or cannot attach; ``start``
returns a reason with a fix instead, and the run goes on with the sampler alone.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from profiler.store import STACKS_NAME

DEFAULT_RATE = 10
MAX_RATE = 1000
OUTPUT = STACKS_NAME


def find_pyspy() -> str | None:
    """$STALLSCOPE_PYSPY if set, else the py-spy next to this interpreter (a venv), else on PATH."""
    override = os.environ.get("STALLSCOPE_PYSPY")
    if override:
        return override if os.path.exists(override) else None
    here = Path(sys.executable).with_name("py-spy")
    if here.exists():
        return str(here)
    return shutil.which("py-spy")


def attach_problem(stderr: str) -> str:
    """Turn py-spy's failure output into one line saying why and how to fix it."""
    text = " ".join(stderr.split())
    low = text.lower()
    if "permission denied" in low or "operation not permitted" in low or "eperm" in low:
        return (
            f"py-spy cannot read the process ({text[:160]}): run stallscope as root, or allow ptrace with "
            "`sudo sysctl kernel.yama.ptrace_scope=0`; in Docker add `--cap-add SYS_PTRACE`"
        )
    if "failed to find python version" in low or "not a python" in low:
        return f"py-spy found no Python interpreter in the process ({text[:160]}): is the command a Python program?"
    if "no such process" in low:
        return "the process exited before py-spy could attach"
    return f"py-spy failed: {text[:200]}" if text else "py-spy exited without output"


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

    def start(self, attach_timeout_s: float = 3.0) -> str | None:
        """Attach; None when recording, else the reason (and fix) it is not."""
        if not 1 <= self.rate <= MAX_RATE:
            raise ValueError(f"py-spy rate {self.rate} is out of range: allowed 1..{MAX_RATE}")
        exe = self.exe or find_pyspy()
        if exe is None:
            self.problem = "py-spy is not installed: `pip install py-spy` (it ships a static binary)"
            return self.problem
        self.args = [
            exe, "record", "--pid", str(self.pid), "--subprocesses", "--idle", "--threads", "--nonblocking",
            "--rate", str(self.rate), "--format", "speedscope", "--output", str(self.out),
        ]  # fmt: skip
        # py-spy prints progress on stderr; keep it for the failure reason, never show it to the user
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.started_at = time.time()
        deadline = time.monotonic() + attach_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                self.problem = attach_problem(err)
                return self.problem
            time.sleep(0.05)
        return None

    def stop(self, timeout_s: float = 20.0) -> str | None:
        """Let py-spy write its output and exit; returns a problem line if it could not."""
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
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        if self.problem is None and not (self.out.exists() and self.out.stat().st_size > 0):
            self.problem = "py-spy wrote no samples (the process exited before the first sample?)"
        return self.problem
