"""A kernel recorder that costs the training thread what CUPTI's windows cost on a real H200 (2026-11-28).

No machine of this project has a GPU, so kernel windows are tested with this stand-in for
:class:`profiler.core.kernel_windows.windows.TorchKernelRecorder`. Measured there (shared/measured/h200-2026-11-28.md):
one window cost the training thread 0.4-1.6 s (604 ms on ResNet-50 b64), and the steps inside a window ran about 20%
slower (32.3 against 27.0 ms: traced launches). So, by default:

- ``start()`` blocks the calling thread ``START_S`` (CUPTI's subscription), ``stop()`` ``STOP_S`` (the stop's
  synchronize, the profiler's post-processing and the read of its events);
- while a window is open, :func:`slowdown` says ``1 + SLOW``: a test's loop multiplies its step's work by it
  (:func:`work`), as CUPTI's callbacks slow every launch;
- the activities are ``ACTS`` kernels per window of 1 us each, launched at the stop (the default 0: a window that
  recorded nothing);
- ``sync=1``: the stop first waits for the device (``torch.cuda.synchronize()``, whatever ``torch.cuda`` is in this
  process: a modelled device in tests/data/device_train.py), as a real window's close does;
- ``off=1``: CUDA's path (``off_thread``): the recorder starts and stops on the windows' own thread
  (profiler.core.kernel_windows.windows.WindowThread), its stop a sleep there (the profiler's stop releases the GIL),
  then ``hold`` seconds holding the GIL (kineto's trace export, C++: one C call that never lets the GIL go); with
  ``acts``, as many kernels more are launched after the window's boundary (steps the stop overlapped: the
  window must drop them).

``STALLSCOPE_FAKE_CUPTI="start=0.05,stop=0.6,slow=0.2,acts=0"`` changes them (in a subprocess too). Use it as
``Session(kernel_recorder=CuptiLike(clock))``, or for ``stallscope run`` and ``run -- CMD`` with
``STALLSCOPE_KERNEL_RECORDER=cupti_like:CuptiLike`` and this folder on ``PYTHONPATH``. ``CALLS`` keeps each
start's and stop's clock readings (before, after) in this process, and ``STALLSCOPE_FAKE_CUPTI_CALLS=FILE`` appends
them to FILE as JSON lines (a subprocess's: ``read_calls``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

ENV = "STALLSCOPE_FAKE_CUPTI"
CALLS_ENV = "STALLSCOPE_FAKE_CUPTI_CALLS"
DEFAULTS = {"start": 0.05, "stop": 0.6, "slow": 0.2, "acts": 0.0, "sync": 0.0, "off": 0.0, "hold": 0.0}
ACTIVE = [False]
CALLS: list[tuple[str, float, float]] = []  # ("start" | "stop" | "hold", clock before, clock after)


def _called(what: str, t0: float, t1: float) -> None:
    CALLS.append((what, t0, t1))
    if path := os.environ.get(CALLS_ENV):
        with open(path, "a") as f:
            f.write(json.dumps([what, t0, t1]) + "\n")


def read_calls(path: str | os.PathLike[str]) -> list[tuple[str, float, float]]:
    """The calls a subprocess's recorders wrote to ``path`` (``STALLSCOPE_FAKE_CUPTI_CALLS``), in order."""
    with open(path) as f:
        return [(w, t0, t1) for w, t0, t1 in map(json.loads, f)]


def settings() -> dict[str, float]:
    out = dict(DEFAULTS)
    for part in filter(None, os.environ.get(ENV, "").split(",")):
        key, _, value = part.partition("=")
        out[key.strip()] = float(value)
    return out


def slowdown() -> float:
    """How much slower a step's work runs now: 1 + SLOW inside a window, else 1."""
    return 1.0 + settings()["slow"] if ACTIVE[0] else 1.0


def work(seconds: float) -> None:
    """A step's work of ``seconds``, slowed inside a window (a sleep: the loop's own time, CPU left free)."""
    time.sleep(seconds * slowdown())


class CuptiLike:
    """The recorder (profiler.core.kernel_windows.windows.KernelRecorder's protocol)."""

    source = "cupti"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.cfg = settings()
        self.off_thread = bool(self.cfg["off"])
        self.parts: dict[str, float] = {}

    def usable(self) -> str | None:
        return None

    def start(self) -> None:
        t0 = self.clock()
        _block(self.cfg["start"])
        ACTIVE[0] = True
        _called("start", t0, self.clock())

    def mark(self) -> float:
        """The window's boundary (off_thread): the clock now; the loop's steps after it are not slowed."""
        ACTIVE[0] = False
        return self.clock()

    def stop(self, boundary: float | None = None) -> list[tuple[int, int, float, float, float]]:
        t0 = self.clock()
        if self.cfg["sync"]:
            import torch

            torch.cuda.synchronize()
        ACTIVE[0] = False
        _block(self.cfg["stop"])
        t1 = self.clock()
        hold_gil(self.cfg["hold"])
        self.parts = {"read": self.clock() - t1}
        _called("stop", t0, self.clock())
        if self.cfg["hold"]:
            _called("hold", t1, t1 + self.parts["read"])
        n = int(self.cfg["acts"])
        at = t0 if boundary is None else boundary
        acts = [(7, 0, at + i * 2e-6, at + i * 2e-6 + 1e-6, at) for i in range(n)]
        if boundary is not None:  # launched after the boundary, before the stop: steps the window did not record
            acts += [(7, 0, t0 + i * 2e-6, t0 + i * 2e-6 + 1e-6, t0) for i in range(n)] if t0 > boundary else []
        return acts


def _block(seconds: float) -> None:
    """The training thread held, as by C++ code that keeps the GIL: a sleep (the clock moves, the CPU is free)."""
    time.sleep(seconds)


_PER_ITEM: list[float] = []


def hold_gil(seconds: float) -> None:
    """Hold the GIL about ``seconds``: one ``sum`` over a range, a single C call that never lets it go (as kineto's
    trace export does), its length calibrated once on this host."""
    if seconds <= 0:
        return
    if not _PER_ITEM:
        t0 = time.perf_counter()
        sum(range(2_000_000))
        _PER_ITEM.append((time.perf_counter() - t0) / 2_000_000)
    sum(range(int(seconds / _PER_ITEM[0])))
