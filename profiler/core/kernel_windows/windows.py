"""Kernel windows: a few steps now and then during which the device's own activity is recorded, in the training
process, with the launch time of each kernel, copy and set.

A :class:`KernelWindows` opens a window at a step boundary the Session's tick stops at (the Session makes its
next tick due at the window's first and last step: outside the windows the hot path does nothing more), and at
the window's end puts the window's span and cost (``GWIN``, :mod:`profiler.core.steps.events`), so it reaches the
store through the same ring as the steps.

Off the training thread: CUPTI records the whole process, whichever thread started it, so a recorder that says so
(``off_thread``: CUDA's) is started and stopped on a thread of the windows' own (:class:`WindowThread`). The
training thread waits for the start (about a millisecond), and at the window's last step only marks the boundary
(one CUDA event: ``GREC``, the recorded steps end there) and hands the stop over: the profiler's stop (CUPTI's
flush and kineto's post-processing, C++ that releases the GIL) runs there while the training goes on, and so
does the hand-over of its activities (kineto's trace export through torch's public ``export_chrome_trace``: C++
that holds the GIL while it writes, so the training thread waits that long, about 1 us an event, and no longer:
no call into torch goes around its Python API, which could take the training down on another torch). The
window's span, whose steps are held apart, ends when that thread has finished; the activities launched after the
boundary are dropped (:func:`recorded`). benchmarks/window_cost.py measures what each path costs the training
thread. Its activities go before it as ``GPU`` events, or, where a sampler
process reads them (``handoff``), as kineto's own trace file (:mod:`profiler.core.kernel_windows.trace_file`). The steps
it held are left out of the run's figures (:mod:`profiler.analysis.apart`). The analysis (:mod:`profiler.analysis.gpu`)
splits each window step's device time into kernels running and idle because of input, the host, synchronisation and
short gaps.

Recorders (:class:`KernelRecorder`):
- :class:`TorchKernelRecorder`: ``torch.profiler`` with CUDA activity only (CUPTI): the kernels, copies and sets,
  and the runtime calls that launched them (linked by correlation id). The events are read in the process
  (``stop``: ``kineto_results.events()``) or written by kineto for another process (``stop_to``). Kineto's times
  are on the wall clock (ns since the epoch): they are put on the Session's clock by pairs of readings of both
  taken at the window's start and end.
  CUPTI's traps: its callbacks stay attached after a profile unless it is torn down, which slows every later
  kernel launch; ``TEARDOWN_CUPTI=1`` is set for the process unless the user set it. Where it is ``0``
  (``torch.compile``'s CUDA graphs set it: tearing CUPTI down under graphs crashes), only the first window runs,
  and the run says so; so too before CUDA 12.6 (:func:`reinit_risk`: CUPTI set up again after its teardown can
  crash a process that replays graphs, which a script may capture without torch.compile).
  A window never opens while a CUDA graph is being captured.
- :class:`SimKernelRecorder`: the simulated device's operations, as kernels launched at their issue times
  (SIMULATED: labelled so wherever shown).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from profiler.core.kernel_windows.trace_file import recorded, trace_path, write_clock
from profiler.core.steps.events import GPU, GREC, GWIN, NAN, Event

KINDS = ("kernel", "memcpy", "memset", "collective")  # an activity's kind code is its index here
_SYNC = re.compile(r"^(Stream Wait Event|Stream Sync|Context Sync|Event Sync|Device Sync)")
MAX_STREAMS = 1 << 20  # stream ids above this are not streams (kineto's "unknown" values)
MAX_INDEX = 1 << 62  # no more windows
START_WAIT_S = 30.0  # the training thread waits this long for a window thread's start (CUPTI's first subscription)
STOP_WAIT_S = 120.0  # a run's close waits this long for a window's stop still running on its thread
FOR_GOOD = "once: "  # a reason from usable() that starts with this stops every later window; any other, this step's


class KernelWindowError(ValueError):
    """A kernel-window plan that cannot be read: the message names the value and what is allowed."""


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """Windows of ``steps`` steps: the first opens ``after`` steps past the warm-up, then one every ``every``
    steps (0: only the first)."""

    after: int = 5
    steps: int = 20
    every: int = 2000
    tail: bool = False  # after the measured steps (tail_plan): the loop runs ``steps`` steps more for it

    def first(self, warmup: int) -> int:
        return warmup + self.after

    def known_length(self, steps: int | None) -> WindowPlan:
        """This plan for a run of ``steps`` measured steps (None: not known): ``auto`` becomes :func:`tail_plan`."""
        return tail_plan(steps) if steps is not None and self == DEFAULT_PLAN else self

    def describe(self) -> str:
        if self.tail:
            return f"{self.steps} steps after the {self.after} measured steps"
        again = f", then every {self.every} steps" if self.every else ""
        return f"{self.steps} steps from {self.after} after the warm-up{again}"


DEFAULT_PLAN = WindowPlan()
# ``auto`` where the run's length is known (``Session(steps=N)``: run, sweep and tune trials, each rank): one window
# right after the N measured steps, of a third of N (TAIL_MIN to TAIL_MAX steps), so that no measured step is
# shortened or slowed; the loop runs those steps more (Session.tail_steps). The meta key names its first step.
TAIL_MIN, TAIL_MAX = 5, 20
RECORDER_ENV = "STALLSCOPE_KERNEL_RECORDER"  # "module:factory": a recorder of one's own, factory(clock) -> recorder


def tail_plan(steps: int) -> WindowPlan:
    """``auto`` for a run of ``steps`` measured steps: one window after them (see TAIL_MIN)."""
    return WindowPlan(after=steps, steps=min(TAIL_MAX, max(TAIL_MIN, -(-steps // 3))), every=0, tail=True)


def parse_plan(text: str) -> WindowPlan | None:
    """``off`` (None), ``auto`` (the default), or ``AFTER:STEPS[:EVERY]``."""
    if text in ("off", "none"):
        return None
    if text in ("auto", "on", ""):
        return DEFAULT_PLAN
    parts = text.split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        nums = []
    if len(nums) not in (2, 3) or nums[0] < 0 or nums[1] < 2 or (len(nums) == 3 and nums[2] and nums[2] <= nums[1]):
        raise KernelWindowError(
            f"kernel windows {text!r}: allowed off, auto, or AFTER:STEPS[:EVERY] (AFTER >= 0 steps past the warm-up, "
            "STEPS >= 2, EVERY 0 or more than STEPS)"
        )
    return WindowPlan(nums[0], nums[1], nums[2] if len(nums) == 3 else 0)


# (stream, kind code, start, end, launch): Session-clock seconds, launch NaN where unknown
Activity = tuple[int, int, float, float, float]


class KernelRecorder(Protocol):
    """Records the device's activity between :meth:`start` and :meth:`stop`. A recorder whose ``off_thread`` is
    true records the whole process from any thread (CUPTI): its start and stop run on a :class:`WindowThread`, its
    ``mark()`` is called on the training thread at the window's last step, and ``stop(boundary)`` (or
    ``stop_to(path, boundary)``) first waits for that mark; its ``parts["read"]`` is the stop's part that held the
    GIL (the read, or the hand-over of its activities)."""

    source: str  # "cupti" or "sim" (SIMULATED)

    def usable(self) -> str | None:
        """None when a window may open now, else why not: a reason that starts with ``FOR_GOOD`` ("once: ") stops
        every later window, any other only this step's (tried again at the next)."""

    def start(self) -> None: ...

    def stop(self) -> list[Activity]: ...


class OffThreadRecorder(Protocol):
    """What a :class:`WindowThread` calls on a recorder whose ``off_thread`` is true (see KernelRecorder)."""

    parts: dict[str, float]

    def start(self) -> None: ...

    def stop(self, boundary: object = None) -> list[Activity]: ...

    def stop_to(self, path: Path, boundary: object = None) -> None: ...


class WindowThread:
    """A thread of the kernel windows' own, where a process-wide recorder starts and stops (see the module).
    Jobs run one at a time, in order; the recorder's thread-local state (torch.profiler's) stays on this thread."""

    def __init__(self, recorder: OffThreadRecorder, clock: Callable[[], float]) -> None:
        self.recorder, self.clock = recorder, clock
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.done = threading.Event()  # the last stop handed over has ended
        self.result: tuple[list[Activity], float, float] | BaseException = ([], 0.0, 0.0)  # its (acts, held, end)
        self._thread = threading.Thread(target=self._run, name="stallscope-kernel-window", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def start(self) -> None:
        """The recorder's start, run there and waited for (up to START_WAIT_S); raises what it raised."""
        box: list[BaseException] = []
        ran = threading.Event()

        def job() -> None:
            try:
                self.recorder.start()
            except BaseException as exc:  # noqa: BLE001 - raised on the training thread below
                box.append(exc)
            ran.set()

        self._jobs.put(job)
        if not ran.wait(START_WAIT_S):
            raise TimeoutError(f"the recorder did not start within {START_WAIT_S:.0f} s")
        if box:
            raise box[0]

    def stop(self, boundary: object, path: Path | None) -> None:
        """Hand the stop over: there it waits for ``boundary``, stops and reads the activities, or hands them over to
        ``path``; :attr:`done` is set when it has ended, :attr:`result` then holds them (none where handed over),
        the seconds its read held the GIL and the clock at its end, or what it raised."""
        self.done.clear()

        def job() -> None:
            rec = self.recorder
            try:
                if path is not None:
                    rec.stop_to(path, boundary)
                    acts: list[Activity] = []
                else:
                    acts = rec.stop(boundary)
                self.result = (acts, float(rec.parts.get("read", 0.0)), self.clock())
            except Exception as exc:  # noqa: BLE001 - said in the run by the training thread
                self.result = exc
            self.done.set()

        self._jobs.put(job)

    def close(self) -> None:
        self._jobs.put(None)


class KernelWindows:
    """Opens and closes the windows of ``plan`` at the Session's ticks; puts what each recorded as step events."""

    def __init__(self, plan: WindowPlan, recorder: KernelRecorder, warmup: int, clock: Callable[[], float]) -> None:
        self.plan, self.recorder, self.clock = plan, recorder, clock
        self.next_index = plan.first(warmup)  # the step at whose tick something is due
        self.window = 0  # windows recorded
        self.open_at: tuple[int, float, float] | None = None  # (step, opening began, start cost) of the open window
        # a window whose stop runs on the window thread: (step it closed at, opening began, cost so far, boundary)
        self.closing: tuple[int, float, float, float] | None = None
        self.skipped: list[str] = []  # why windows did not open
        self.handoff: Path | None = None  # the run directory, where a sampler process reads handed-over windows
        self.spans: list[tuple[float, float]] = []  # each window's pause on the clock: its opening's start to now
        self._thread: WindowThread | None = None  # where an off_thread recorder starts and stops

    @property
    def tail_steps(self) -> int:
        """The steps a loop runs after its measured ones for a tail window (0: the plan has none)."""
        return self.plan.steps if self.plan.tail else 0

    def tail_at(self, index: int) -> int:
        """Open the tail window at step ``index`` instead (the measured steps ended early): its steps, or 0."""
        if not self.plan.tail or self.window or self.open_at is not None or self.closing is not None:
            return 0
        self.next_index = index
        return self.plan.steps

    def at(self, index: int, put: Callable[[Event], object]) -> None:
        """The tick of step ``index`` (its batch has come): open or close a window that is due, or take one whose
        stop has ended on the window thread."""
        if index < self.next_index:
            return
        if self.closing is not None:
            self._collect(index, put)
        elif self.open_at is None:
            self._open(index)
        else:
            self._close(index, put)

    def _open(self, index: int) -> None:
        try:  # a recorder that fails never stops the training: the run says why, and no window opens again
            why = self.recorder.usable()
            if why is None:
                t0 = self.clock()
                self._start()
                t1 = self.clock()
        except Exception as exc:  # noqa: BLE001 - whatever CUPTI or torch.profiler raised, said in the run
            why = f"{FOR_GOOD}the recorder failed to start ({type(exc).__name__}: {exc})"
        if why is not None:
            if why.startswith(FOR_GOOD):  # no window opens again
                self.skipped.append(f"step {index}: {why}")
                self.next_index = MAX_INDEX
            else:  # for now (a CUDA graph being captured): at the next step, said once
                if not self.skipped or not self.skipped[-1].endswith(why):
                    self.skipped.append(f"step {index}: {why}")
                self.next_index = index + 1
            return
        self.open_at = (index, t0, t1 - t0)
        self.next_index = index + self.plan.steps

    def _start(self) -> None:
        if not getattr(self.recorder, "off_thread", False):
            self.recorder.start()
            return
        if self._thread is None:
            self._thread = WindowThread(self.recorder, self.clock)  # type: ignore[arg-type]
        self._thread.start()

    def close(self, put: Callable[[Event], object]) -> None:
        """At the run's close: end the open window (if any) and wait for a stop still running on the window thread
        (up to STOP_WAIT_S); put their activities and events."""
        if self.open_at is not None:
            self._close(self.open_at[0] + self.plan.steps, put)
        if self.closing is not None and self._thread is not None:
            if self._thread.done.wait(STOP_WAIT_S):
                self._collect(MAX_INDEX, put)
            else:
                self._lost(self.closing[0], "stop", TimeoutError(f"still running after {STOP_WAIT_S:.0f} s"))
                self.closing = None
        if self._thread is not None:
            self._thread.close()
            self._thread = None

    def _close(self, index: int, put: Callable[[Event], object]) -> None:
        """End the open window at step ``index``: here, or (off_thread) by handing its stop to the window thread."""
        assert self.open_at is not None
        at, t_open, cost_open = self.open_at
        self.open_at = None
        t0 = self.clock()
        thread, path = self._thread, self._handoff_path()
        if thread is not None:
            try:
                boundary = self.recorder.mark()  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - said in the run; the stop then waits for the whole device
                boundary = None
                self.skipped.append(f"step {index}: the window's end could not be marked ({type(exc).__name__}: {exc})")
            t_rec = self.clock()  # what was launched before it is the window's
            thread.stop(boundary, path)
            put((GREC, self.window, t_rec, NAN, NAN))
            self.closing = (at, t_open, cost_open + self.clock() - t0, t_rec)
            self.next_index = index + 1
            return
        try:
            if path is not None:  # read off this thread (profiler.core.kernel_windows.trace_file)
                acts: list[Activity] = []
                self.recorder.stop_to(path)  # type: ignore[attr-defined]
            else:
                acts = self.recorder.stop()
        except Exception as exc:  # noqa: BLE001 - said in the run; the window is lost, the training goes on
            self._lost(at, "stop", exc)
            return
        t1 = self.clock()  # the window spans the training thread's pause: from its opening's start to now
        self._put(put, acts, t_open, t1, cost_open + t1 - t0)
        self.next_index = at + self.plan.every if self.plan.every else MAX_INDEX

    def _handoff_path(self) -> Path | None:
        """Where the window is handed over as kineto's trace (None: its activities are read in this process)."""
        return trace_path(self.handoff, self.window) if self.handoff is not None and callable(
            getattr(self.recorder, "stop_to", None)) else None  # fmt: skip

    def _collect(self, index: int, put: Callable[[Event], object]) -> None:
        """Take the window whose stop ran on the window thread, once it has ended (else look again next step)."""
        thread, closing = self._thread, self.closing
        assert thread is not None and closing is not None
        if not thread.done.is_set():
            self.next_index = index + 1
            return
        at, t_open, cost, boundary = closing
        self.closing = None
        self.next_index = at + self.plan.every if self.plan.every else MAX_INDEX
        if isinstance(result := thread.result, BaseException):
            self._lost(at, "stop", result)
            return
        acts, held, t_end = result
        self._put(put, recorded(acts, boundary), t_open, t_end, cost + held)

    def _put(self, put: Callable[[Event], object], acts: list[Activity], t_open: float, t_end: float, cost: float
             ) -> None:  # fmt: skip
        for stream, kind, start, end, launch in acts:
            put((GPU, stream * 4 + kind, start, end, launch))
        put((GWIN, self.window, t_open, t_end, cost))
        self.spans.append((t_open, t_end))
        self.window += 1

    def _lost(self, index: int, what: str, exc: BaseException) -> None:
        self.skipped.append(f"step {index}: {FOR_GOOD}the recorder failed to {what} ({type(exc).__name__}: {exc})")
        self.next_index = MAX_INDEX


def make_recorder(device_kind: str, timer: object, clock: Callable[[], float]) -> KernelRecorder | None:
    """The recorder for the Session's device: one of the user's own (RECORDER_ENV), CUPTI on CUDA, the simulated
    device's own on ``sim:``, else None."""
    if own := os.environ.get(RECORDER_ENV):
        return own_recorder(own, clock)
    sim = getattr(timer, "kernel_recorder", None)
    if callable(sim):
        rec: KernelRecorder = sim(clock)
        return rec
    if device_kind != "cuda":
        return None
    import torch

    return TorchKernelRecorder(torch, clock)


def own_recorder(spec: str, clock: Callable[[], float]) -> KernelRecorder:
    """``module:factory`` called with the Session's clock (a recorder for another accelerator, or a test's fake
    that costs what CUPTI cost on a real GPU: tests/cupti_like.py)."""
    rec: KernelRecorder = own_factory(spec)(clock)
    return rec


def own_factory(spec: str) -> Callable[[Callable[[], float]], KernelRecorder]:
    """The factory ``module:factory`` names (KernelWindowError: it cannot be imported, or is not callable)."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        factory, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "not callable"
    if not callable(factory):
        raise KernelWindowError(
            f"{RECORDER_ENV}={spec!r}: allowed MODULE:FACTORY, an importable module and a callable in it ({why})"
        )
    return factory  # type: ignore[no-any-return]


# -- torch.profiler (CUPTI) ---------------------------------------------------------------------------------------
class TorchKernelRecorder:
    """CUDA activity through ``torch.profiler`` (see the module)."""

    source = "cupti"

    def __init__(self, torch_mod: ModuleType, clock: Callable[[], float], activity: str = "cuda") -> None:
        """``activity`` "cpu": the same path over torch's CPU operators, which a machine without a GPU can time
        (benchmarks/window_cost.py); the run's recorder is always "cuda"."""
        self._torch, self._clock, self._cuda = torch_mod, clock, activity == "cuda"
        self.off_thread = self._cuda  # CUPTI records every thread's launches; CPU operators only the starter's
        self._prof: Any = None
        self._pairs: list[tuple[float, int]] = []
        self._used = False
        self._device: int | None = None  # the training thread's CUDA device, made the window thread's too
        self.parts: dict[str, float] = {}  # the last window's cost by part (s): start, sync, stop, read
        os.environ.setdefault("TEARDOWN_CUPTI", "1")

    def usable(self) -> str | None:
        cuda = self._torch.cuda
        if not self._cuda:
            return None
        if not cuda.is_available():
            return f"{FOR_GOOD}CUDA is not available in this process"
        if self._used and os.environ.get("TEARDOWN_CUPTI") != "1":
            return (
                f"{FOR_GOOD}TEARDOWN_CUPTI is not 1 (torch.compile's CUDA graphs set it 0), so CUPTI stays "
                "attached after a window: only the first one runs"
            )
        if self._used and (why := reinit_risk(self._torch)) is not None:
            return f"{FOR_GOOD}{why}"
        capturing = getattr(cuda, "is_current_stream_capturing", None)
        if cuda.is_initialized() and callable(capturing) and capturing():
            return "a CUDA graph is being captured"
        # here, on the training thread: its device. The window thread starts on device 0, where the profiler's
        # stop (torch.cuda.synchronize()) would make a context of its own on another rank's GPU
        self._device = int(cuda.current_device()) if cuda.is_initialized() else None
        return None

    def start(self) -> None:
        prof, clock = self._torch.profiler, self._clock
        t0 = clock()
        if self._cuda and self._device is not None:
            self._torch.cuda.set_device(self._device)  # this thread's device: the training thread's
        what = prof.ProfilerActivity.CUDA if self._cuda else prof.ProfilerActivity.CPU
        self._prof = prof.profile(activities=[what])
        self._pairs = [wall_pair(clock)]
        self._prof.start()
        self._used = True
        self.parts = {"start": clock() - t0}

    def mark(self) -> object:
        """The window's boundary on the training thread's stream (a CUDA event; None off CUDA)."""
        if not self._cuda:
            return None
        ev = self._torch.cuda.Event()
        ev.record()
        return ev

    def stop(self, boundary: object = None) -> list[Activity]:
        """End the window and read its activities here (about 8 us an event, holding the GIL)."""
        prof = self._end(boundary)
        if prof is None:
            return []
        t = self._clock()
        events = prof.profiler.kineto_results.events()
        device = self._torch.autograd.DeviceType.CUDA if self._cuda else self._torch.autograd.DeviceType.CPU
        acts = kineto_activities(events, clock_map(self._pairs), device)
        self.parts.update(read=self._clock() - t, events=float(len(events)))
        return acts

    def stop_to(self, path: Path, boundary: object = None) -> None:
        """End the window and hand its activities over as kineto's own trace at ``path``, written by torch's public
        ``export_chrome_trace`` (kineto's C++, the GIL held while it writes: ``read`` counts it), with the clock pairs
        beside it, for another process to read (core.kernel_windows.trace_file)."""
        prof = self._end(boundary)
        if prof is None:
            return
        t = self._clock()
        path.parent.mkdir(parents=True, exist_ok=True)
        t_save = self._clock()
        prof.export_chrome_trace(str(path))
        t_saved = self._clock()
        write_clock(path, *clock_offset(self._pairs), cpu=not self._cuda)
        end = self._clock()
        self.parts.update(read=end - t, export=t_saved - t_save)  # the export held the GIL: read counts it

    def _end(self, boundary: object) -> Any:
        """The window's profiler stopped once the device has reached ``boundary`` (None: all that was launched),
        and the closing clock pair taken."""
        prof, self._prof, clock = self._prof, None, self._clock
        if prof is None:
            return None
        t0 = clock()
        if self._cuda:  # the window's last kernels end inside it (an event's wait releases the GIL)
            boundary.synchronize() if boundary is not None else self._torch.cuda.synchronize()  # type: ignore[attr-defined]
        t1 = clock()
        prof.stop()  # CUPTI's flush and kineto's post-processing, in C++ with the GIL released
        self.parts.update(sync=t1 - t0, stop=clock() - t1)
        self._pairs.append(wall_pair(clock))
        return prof


def reinit_risk(torch_mod: object) -> str | None:
    """Why a second window must not open under this torch's CUDA, or None. Before CUDA 12.6, CUPTI set up again
    after its teardown (``TEARDOWN_CUPTI=1``, which a window sets) can crash a process that replays CUDA graphs
    (torch's own note, where ``torch.compile`` turns the teardown off); stallscope cannot see graphs a script
    captures itself, so there only the first window runs. The start-up module of ``run --`` has a copy."""
    text = str(getattr(getattr(torch_mod, "version", None), "cuda", None))
    try:
        major, minor = (int(x) for x in text.split(".")[:2])
    except ValueError:
        return None  # no CUDA build (a test's stand-in)
    if (major, minor) >= (12, 6):
        return None
    return (
        f"CUDA {text} (before 12.6): setting CUPTI up again after its teardown can crash a process that replays "
        "CUDA graphs, so only the first window runs"
    )


def wall_pair(clock: Callable[[], float]) -> tuple[float, int]:
    """A reading of ``clock`` and of the wall clock (ns) as close together as three tries give."""
    best: tuple[float, float, int] | None = None
    for _ in range(3):
        a = clock()
        w = time.time_ns()
        b = clock()
        if best is None or b - a < best[0]:
            best = (b - a, (a + b) / 2, w)
    assert best is not None
    return best[1], best[2]


def clock_map(pairs: list[tuple[float, int]]) -> Callable[[int], float]:
    """Wall-clock ns to the Session's clock, from pairs of readings (the mean offset: the wall clock may be stepped
    by NTP between runs, not within a window of seconds). In integer ns first: a float holds ns since the epoch
    only to 256 ns."""
    ref, offset = clock_offset(pairs)
    return lambda wall_ns: (wall_ns - ref) / 1e9 - offset


def clock_offset(pairs: list[tuple[float, int]]) -> tuple[int, float]:
    """(reference wall-clock ns, offset s) of :func:`clock_map`: ``clock = (wall_ns - ref) / 1e9 - offset``."""
    ref = pairs[0][1]
    return ref, sum((w - ref) / 1e9 - c for c, w in pairs) / len(pairs)


def kineto_activities(events: Any, to_clock: Callable[[int], float], cuda: object) -> list[Activity]:
    """The device's kernels, copies and sets among kineto's events, with their launch calls' times."""
    launches: dict[int, int] = {}
    device = []
    for e in events:
        if e.device_type() == cuda:
            device.append(e)
        elif (corr := e.correlation_id()) > 0:
            launches[corr] = int(e.start_ns())
    out: list[Activity] = []
    for e in device:
        name = e.name()
        if _SYNC.match(name):
            continue
        stream = int(e.device_resource_id())
        if not 0 <= stream < MAX_STREAMS:
            continue
        kind = 1 if name.startswith("Memcpy") else 2 if name.startswith("Memset") else 0
        kind = 3 if kind == 0 and "nccl" in name.lower() else kind
        start = int(e.start_ns())
        launch = launches.get(e.correlation_id()) or launches.get(e.linked_correlation_id())
        out.append((stream, kind, to_clock(start), to_clock(start + int(e.duration_ns())),
                    to_clock(launch) if launch is not None else NAN))  # fmt: skip
    out.sort(key=lambda a: a[2])
    return out
