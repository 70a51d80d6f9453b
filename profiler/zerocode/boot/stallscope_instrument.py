"""Times every DataLoader iteration inside a program stallscope launched, with no change to the program.

Loaded at interpreter start-up by this directory's ``sitecustomize`` (``stallscope run -- CMD`` puts the
directory first on the command's ``PYTHONPATH``). It runs in the *script's* environment, which need not be
stallscope's: it imports only the standard library, and torch only once the script imports it.

What it does, once ``torch.utils.data.dataloader`` is imported (a post-import hook on ``sys.meta_path``):

- ``DataLoader.__init__``: records the construction site (the first frame outside torch and this module,
  ``train.py:57``) and the loader's knobs; applies the overrides stallscope gave (``STALLSCOPE_OVERRIDES``,
  a JSON object: ``num_workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``, ``batch_size``).
- ``DataLoader.__iter__``: the time ``iter()`` took (workers start there) and which loader the iterator is.
- ``_BaseDataLoaderIter.__next__``: each call's start and end on ``time.perf_counter`` (CLOCK_MONOTONIC on
  Linux, the clock stallscope's own process reads) and the batch's sample count; the call that raises
  StopIteration ends the epoch.
- ``nvidia.dali.plugin.pytorch.DALIGenericIterator`` (and its subclasses), once imported: the same records,
  the iterator being its own loader (knobs from its pipeline: batch size, CPU threads, queue depth).
- ``torchdata.nodes.Loader`` / ``LoaderIterator.__next__``, once imported: the same records (knobs from its
  graph: batch size, the mapper's workers, prefetch depth, pinning). Overrides apply to DataLoaders only.
- Ray Data's ``DataIterator._iter_batches`` (behind ``iter_batches`` and ``iter_torch_batches``), once imported:
  the same records, one loader per call site of the line that builds the iterator, each call an epoch.
- On CUDA, once the script has initialised it: an event at each ``next()``'s start and return (DeviceClock).

Records go to ``$STALLSCOPE_INSTRUMENT_DIR/p<pid>.jsonl``, one JSON object a line, written by the thread that
makes them once ``FLUSH_EVERY`` have gathered or ``FLUSH_S`` has passed, and at exit (no thread of this module's
runs in the script's process). For tuning trials,
``STALLSCOPE_STOP`` (``CALLS[,SECONDS,MIN_CALLS]``) ends the process cleanly (SystemExit(0) from ``next()``)
once a loader has returned CALLS batches, or SECONDS after its first batch once it has returned MIN_CALLS (the
seconds rule only in a single-process job: ranks must stop at the same step). ``pin_memory: "auto"`` means
True where CUDA is available, else the script's own value.

A torch this cannot handle makes it step aside with one line on stderr and an ``aside``
record; the profiler's py-spy estimate goes on. The record format is read by profiler/zerocode/instrument.py.
"""

from __future__ import annotations

import atexit
import collections
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

DIR_ENV = "STALLSCOPE_INSTRUMENT_DIR"
OVERRIDES_ENV = "STALLSCOPE_OVERRIDES"
STOP_ENV = "STALLSCOPE_STOP"
FLUSH_S = 0.2  # records wait at most this long (or FLUSH_EVERY of them) before they are written
FLUSH_EVERY = 64
KNOBS = ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers", "batch_size")
WINDOWS_ENV = "STALLSCOPE_KERNEL_WINDOWS"  # "AFTER:STEPS[:EVERY]" in a loader's next() calls, or "off"
WINDOWS_DEFAULT = (10, 20, 2000)
# as profiler.core.kernel_windows.windows.START_WAIT_S: the script waits this long for a window's start
START_WAIT_S = 30.0
# as profiler.core.kernel_windows.windows.RECORDER_ENV (this module cannot import it)
RECORDER_ENV = "STALLSCOPE_KERNEL_RECORDER"
_LIBRARIES = tuple(
    os.sep + p + os.sep for p in ("torch", os.path.join("nvidia", "dali"), "torchdata", os.path.join("ray", "data"))
)
_HERE = os.path.dirname(os.path.abspath(__file__))


class Writer:
    """Appends records to this process's file: the hot path appends a record, and writes what is pending itself
    once FLUSH_EVERY records or FLUSH_S have gathered (one ``write``; no thread of its own in the script's process
    to wake it: the GIL's hand-over to one costs a fast loop more than the write). A write that fails (the
    directory gone, the disk full) loses those records, never raises into the script's ``next()``: ``lost`` counts
    them, said once on stderr."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pending: collections.deque[dict[str, object]] = collections.deque()
        self.lock = threading.Lock()
        self.flushed_at = time.perf_counter()
        self.lost = 0  # records a failed write lost

    def put(self, record: dict[str, object]) -> None:
        pending = self.pending
        pending.append(record)
        if len(pending) >= FLUSH_EVERY or time.perf_counter() - self.flushed_at >= FLUSH_S:
            self.flush()

    def forked(self) -> None:
        """In a forked child (a DataLoader worker): nothing of the parent's to write."""
        self.lock = threading.Lock()
        self.pending.clear()

    def flush(self) -> None:
        with self.lock:
            self.flushed_at = time.perf_counter()
            lines = []
            while self.pending:  # default=str: a knob of a type JSON has not is written as its text, never raised
                lines.append(json.dumps(self.pending.popleft(), separators=(",", ":"), default=str))
            if not lines:
                return
            path = os.path.join(self.directory, f"p{os.getpid()}.jsonl")
            try:
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write("\n".join(lines) + "\n")
            except OSError as exc:
                if not self.lost:
                    sys.stderr.write(f"stallscope: instrument records not written ({exc}); the script goes on\n")
                self.lost += len(lines)


def batch_len(batch: Any) -> int | None:
    """Samples in a batch, by profiler.core.steps.batch_facts.batch_len's rule (copied: this module imports nothing of
    stallscope; tests/test_instrument.py checks the two agree): the leading dim of the first tensor-like."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, (list, tuple)) and batch:
            first = batch[0]
            if not (hasattr(first, "shape") or isinstance(first, (list, tuple, dict))):
                return len(batch)  # a batch of plain items
            batch = first
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            return None
    return None


def sibling(name: str) -> ModuleType:
    """A module of this directory, by its file (this one is loaded as ``stallscope_instrument`` from PYTHONPATH by a
    script's interpreter, and as ``profiler.zerocode.boot.stallscope_instrument`` by stallscope's own)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(_HERE, f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def call_site() -> tuple[str, int]:
    """(file, line) of the first frame outside torch, DALI and this directory: where the script built the loader."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not any(lib in path for lib in _LIBRARIES) and not path.startswith((_HERE, "<")):
            return path, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "?", 0


class Stop:
    """When a trial ends: after ``calls`` batches of one loader, or ``seconds`` after its first batch once it
    has returned ``min_calls`` (the seconds rule is off in a job of several ranks)."""

    def __init__(self, calls: int | None, seconds: float | None = None, min_calls: int = 0) -> None:
        self.calls = calls
        self.seconds = seconds if int(os.environ.get("WORLD_SIZE") or 1) <= 1 else None
        self.min_calls = min_calls
        self.first: dict[int, float] = {}

    @classmethod
    def parse(cls, text: str | None) -> Stop | None:
        """``CALLS[,SECONDS,MIN_CALLS]``; CALLS may be empty (no cap on calls). ValueError on anything else."""
        if not text:
            return None
        parts = text.split(",")
        if len(parts) not in (1, 3):
            raise ValueError(f"{text!r} is not CALLS[,SECONDS,MIN_CALLS]")
        calls = int(parts[0]) if parts[0] else None
        if len(parts) == 1:
            return cls(calls)
        return cls(calls, float(parts[1]), int(parts[2]))

    def due(self, lid: int, calls: int, t: float) -> str | None:
        """Why loader ``lid`` ends the process now that its ``calls``-th batch arrived at ``t``, else None."""
        first = self.first.setdefault(lid, t)
        if self.calls is not None and calls > self.calls:
            return "steps"
        if self.seconds is not None and calls >= self.min_calls and t - first >= self.seconds:
            return "seconds"
        return None


class RunQueue:
    """The calling thread's run-queue wait so far (ns, /proc/thread-self/schedstat), for the thread that first
    asks; None on any other thread or where schedstat is not there."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.owner: int | None = None

    def read(self) -> int | None:
        if self.owner is None:
            self.owner = threading.get_ident()
            try:
                self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                self.fd = None
        if self.fd is None or threading.get_ident() != self.owner:
            return None
        try:
            return int(os.pread(self.fd, 64, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None


class DeviceClock:
    """CUDA events at every ``next()`` boundary, once the script itself has initialised CUDA (this never does):
    an event recorded on the current stream as a call starts and as it returns, turned into a time on
    ``time.perf_counter``'s timeline (a reference event, the tightest of a few tries) when the device reaches it, and
    written as a ``dev`` record under the mark's number, which the call's own record carries (``m0``/``m1``).
    Any CUDA error turns it off with one ``dev_off`` record; the host figures go on."""

    POOL = 1024
    MAX_PENDING = 4096  # events the device has not reached yet; beyond that the oldest is waited for
    # reference events tried; the one whose two clock reads are closest is kept: a preemption between them put a
    # stress pass's reference 1.98 ms off, every device time with it, and the stall 1.04 ms a step under its truth
    REF_TRIES = 5

    def __init__(self, writer: Writer) -> None:
        self.writer = writer
        self.cuda: Any = None
        self.ref: Any = None
        self.ref_t = 0.0
        self.device = -1
        self.off = False
        self.pending: collections.deque[tuple[int, Any]] = collections.deque()
        self.pool: list[Any] = []
        self.marks = 0

    def mark(self) -> int | None:
        """An event on the current stream now: its number, or None where none was recorded."""
        if self.off:
            return None
        try:
            if self.ref is None and not self._start():
                return None
            cuda = self.cuda
            if cuda.current_device() != self.device:
                return None  # the script moved to another device: its events would not compare with the reference
            ev = self.pool.pop() if self.pool else cuda.Event(enable_timing=True)
            ev.record()
            self.marks += 1
            self.pending.append((self.marks, ev))
            self.drain(wait=len(self.pending) > self.MAX_PENDING)
            return self.marks
        except Exception as exc:  # noqa: BLE001 - a CUDA error is the script's to meet, not the profiler's
            self.stop(exc)
            return None

    def _start(self) -> bool:
        """The reference event, once torch has initialised CUDA in this process; False until then."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_initialized():
            return False
        self.cuda, self.device = cuda, int(cuda.current_device())
        cuda.synchronize(self.device)
        tries = []
        for _ in range(self.REF_TRIES):
            ref = cuda.Event(enable_timing=True)
            before = time.perf_counter()
            ref.record()  # on an idle device: reached between the two clock reads; the middle is off by half at most
            ref.synchronize()
            tries.append((time.perf_counter() - before, before, ref))
        width, before, self.ref = min(tries, key=lambda t: t[0])
        self.ref_t = before + width / 2
        name = str(cuda.get_device_name(self.device))
        self.writer.put({"k": "devclock", "device": self.device, "name": name, "t": self.ref_t, "err": width / 2})
        return True

    def drain(self, wait: bool = False) -> None:
        """Write the times of the events the device has reached (all of them, waiting, when ``wait``)."""
        pending, ref, put = self.pending, self.ref, self.writer.put
        while pending:
            m, ev = pending[0]
            if wait:
                ev.synchronize()
                wait = len(pending) > self.MAX_PENDING
            elif not ev.query():
                return
            pending.popleft()
            put({"k": "dev", "m": m, "t": self.ref_t + float(ref.elapsed_time(ev)) / 1e3})
            if len(self.pool) < self.POOL:
                self.pool.append(ev)

    def close(self) -> None:
        """At exit: wait for the device to reach every event still pending and write their times."""
        if self.off or self.ref is None or not self.pending:
            return
        try:
            self.cuda.synchronize(self.device)
            self.drain()
        except Exception as exc:  # noqa: BLE001 - as in mark()
            self.stop(exc)

    def stop(self, exc: BaseException) -> None:
        self.off = True
        self.pending.clear()
        self.writer.put({"k": "dev_off", "why": f"{type(exc).__name__}: {exc}"[:300]})


class KernelWindows:
    """Kernel windows in the script's process (as a Session's: profiler/core/kernel_windows/windows.py, which this
    module, running in the script's environment, cannot import): on CUDA, once the script has initialised it, from the
    AFTER-th ``next()`` of a loader for STEPS calls, then every EVERY calls, ``torch.profiler`` with CUDA activity
    records the device's kernels, copies and sets and their launches; each window is one ``kwin`` record naming
    the trace kineto wrote for it (``trace``, with the clock readings that put its times on ``time.perf_counter``:
    stallscope's own process reads it), or, from a recorder of one's own (STALLSCOPE_KERNEL_RECORDER), holding its
    activities ``[stream, kind, start, end, launch]`` (launch -1: not known). Any error turns them off with one
    ``kwin_off`` record.

    CUPTI records every thread of the process, so the profiler starts and stops on a thread of the windows' own
    (as profiler.core.kernel_windows.windows.WindowThread): the script's thread waits for the start, and at the window's
    last call marks the boundary (a CUDA event; ``r`` in the record: the calls after it are not the window's) and goes
    on while the stop and kineto's trace export run there; the record's ``t1`` is their end. A recorder of one's own
    runs there too where it says ``off_thread``, else on the script's thread."""

    def __init__(self, writer: Writer, plan: tuple[int, int, int] | None) -> None:
        self.writer, self.plan = writer, plan
        self.next_call = plan[0] if plan is not None else 1 << 62
        self.prof: Any = None
        self.opened = (0.0, 0.0, 0, 0.0)  # opening began, its cost, the wall clock (ns) and the clock once started
        self.window = 0
        self.jobs: queue.SimpleQueue[Callable[[], None]] | None = None  # the window thread's (at its first window)
        self.stopping = threading.Event()  # set while no stop is running on the window thread
        self.stopping.set()

    @staticmethod
    def parse(text: str | None) -> tuple[int, int, int] | None:
        if text in (None, "", "auto"):
            return WINDOWS_DEFAULT
        if text == "off":
            return None
        nums = [int(x) for x in str(text).split(":")]  # ValueError: bad input, said by install()
        if len(nums) not in (2, 3) or nums[0] < 0 or nums[1] < 2:
            raise ValueError(f"kernel windows {text!r}: allowed off, auto or AFTER:STEPS[:EVERY]")
        return nums[0], nums[1], nums[2] if len(nums) == 3 else 0

    def at(self, calls: int) -> None:
        """The ``calls``-th batch of a loader came: open or close a window that is due."""
        assert self.plan is not None
        try:
            if self.prof is None:
                self._open(calls)
            else:
                self._close(calls)
        except Exception as exc:  # noqa: BLE001 - the profiler's failure is not the script's
            self._off(exc)

    def _off(self, exc: BaseException) -> None:
        self.next_call, self.prof = 1 << 62, None
        self.writer.put({"k": "kwin_off", "why": f"{type(exc).__name__}: {exc}"[:300]})

    def _open(self, calls: int) -> None:
        # "module:factory": a recorder of one's own (profiler.core.kernel_windows.windows)
        own = os.environ.get(RECORDER_ENV)
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if not self.stopping.is_set() or (not own and (torch is None or cuda is None or not cuda.is_initialized())):
            self.next_call = calls + 1  # a stop still running, or not yet on CUDA: try at the next call
            return
        if self.window and not own and (why := reinit_risk(torch)) is not None:
            self.next_call = 1 << 62  # no window again (profiler.core.kernel_windows.windows.reinit_risk)
            self.writer.put({"k": "kwin_off", "why": why})
            return
        t0 = time.perf_counter()
        if own:
            module, _, name = own.partition(":")
            prof = getattr(importlib.import_module(module), name)(time.perf_counter)
        else:
            os.environ.setdefault("TEARDOWN_CUPTI", "1")
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])  # type: ignore[union-attr]
        if own and not getattr(prof, "off_thread", False):
            prof.start()
        elif own:
            self._on_thread(prof.start, wait=True)
        else:  # on the script's device: the window thread starts on device 0, where the stop's synchronize would
            # make a context of its own on another rank's GPU
            device = cuda.current_device()  # type: ignore[union-attr]
            self._on_thread(lambda: (cuda.set_device(device), prof.start()), wait=True)  # type: ignore[union-attr]
        self.prof, t1 = prof, time.perf_counter()
        # the window spans the training thread's pause: from its opening's start (t0) to its closing's end
        self.opened = (t0, t1 - t0, time.time_ns(), t1)
        self.next_call = calls + self.plan[1]  # type: ignore[index]

    def _on_thread(self, job: Callable[[], object], wait: bool) -> None:
        """Run ``job`` on the window thread (``wait``: until it has run, raising what it raised)."""
        if self.jobs is None:
            self.jobs = queue.SimpleQueue()
            threading.Thread(target=self._serve, name="stallscope-kernel-window", daemon=True).start()
        box: list[BaseException] = []
        ran = threading.Event()

        def run() -> None:
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - raised where waited for, else said as kwin_off
                box.append(exc)
                if not wait:
                    self._off(exc)
            ran.set()

        self.jobs.put(run)
        if wait:
            if not ran.wait(START_WAIT_S):  # a start that hangs (CUPTI's) never holds the script: at() turns off
                raise TimeoutError(f"the profiler did not start within {START_WAIT_S:.0f} s")
            if box:
                raise box[0]

    def _serve(self) -> None:
        jobs = self.jobs
        assert jobs is not None
        while True:
            jobs.get()()

    def _close(self, calls: int) -> None:
        prof, own = self.prof, os.environ.get(RECORDER_ENV)
        t0 = time.perf_counter()
        if own and not getattr(prof, "off_thread", False):
            acts = [[float(x) for x in a[:4]] + [a[4] if a[4] == a[4] else -1.0] for a in prof.stop()]
            self._put(self.window, self.opened[0], self.opened[1] + time.perf_counter() - t0, {"acts": acts})
        else:
            boundary = prof.mark() if own else sys.modules["torch"].cuda.Event()
            if not own:
                boundary.record()
            t_rec = time.perf_counter()  # what was launched before it is the window's
            cost = self.opened[1] + t_rec - t0
            self.stopping.clear()
            window = self.window
            self._on_thread(lambda: self._stop(prof, boundary, own, window=window, cost=cost, t_rec=t_rec), wait=False)
        self.prof = None
        self.window += 1
        every = self.plan[2]  # type: ignore[index]
        self.next_call = calls - self.plan[1] + every if every else 1 << 62  # type: ignore[index]

    def _stop(self, prof: Any, boundary: Any, own: str | None, *, window: int, cost: float, t_rec: float) -> None:
        """On the window thread: the stop once the device reached ``boundary``, and the window's record."""
        try:
            t_open, _, wall_open, t_started = self.opened  # the next window opens once this stop has ended
            if own:
                acts = [[float(x) for x in a[:4]] + [a[4] if a[4] == a[4] else -1.0] for a in prof.stop(boundary)]
                held = float(getattr(prof, "parts", {}).get("read", 0.0))
                self._put(window, t_open, cost + held, {"acts": [a for a in acts if (a[4] if a[4] >= 0 else a[2])
                                                                 <= t_rec], "r": t_rec})  # fmt: skip
                return
            boundary.synchronize()  # the window's last kernels end inside it (the wait releases the GIL)
            prof.stop()  # CUPTI's flush and kineto's post-processing: C++, the GIL released
            # kineto's times are wall-clock ns: onto perf_counter by the readings at the opening and now (integer
            # ns first: a float holds ns since the epoch only to 256 ns)
            offset = ((time.time_ns() - wall_open) / 1e9 - (time.perf_counter() - t_started)) / 2
            # kineto writes the window's trace in C++ through torch's public export (the GIL held: the script's
            # thread waits that long, counted in the window's cost); stallscope's process reads it
            # (profiler/core/kernel_windows/trace_file.py), not this process (8 us an event)
            trace = os.path.join(self.writer.directory, f"kwin-{os.getpid()}-{window}.json")
            t_export = time.perf_counter()
            prof.export_chrome_trace(trace)
            held = time.perf_counter() - t_export
            hand = {"acts": [], "trace": trace, "wall_ref": wall_open, "clock_ref": t_started - offset, "r": t_rec}
            self._put(window, t_open, cost + held, hand)
        finally:
            self.stopping.set()

    def _put(self, window: int, t_open: float, cost: float, more: dict[str, object]) -> None:
        """The window's record: its span ends now (its stop and hand-over done)."""
        self.writer.put({"k": "kwin", "w": window, "t0": t_open, "t1": time.perf_counter(), "cost": cost, **more})

    def finish(self) -> None:
        """At the script's exit: wait (up to 60 s) for a stop still running, so that its record is written."""
        self.stopping.wait(60.0)


def reinit_risk(torch: Any) -> str | None:
    """profiler.core.kernel_windows.windows.reinit_risk, copied (this module imports nothing of stallscope): why a
    second window must not set CUPTI up again after its teardown (CUDA before 12.6 with CUDA graphs can crash), else
    None; also where the teardown is off (``TEARDOWN_CUPTI`` not 1: torch.compile's graphs), which would leave CUPTI
    attached."""
    if os.environ.get("TEARDOWN_CUPTI") != "1":
        return "TEARDOWN_CUPTI is not 1 (torch.compile's CUDA graphs set it 0): only the first window runs"
    text = str(getattr(getattr(torch, "version", None), "cuda", None))
    try:
        major, minor = (int(x) for x in text.split(".")[:2])
    except ValueError:
        return None
    if (major, minor) >= (12, 6):
        return None
    return (
        f"CUDA {text} (before 12.6): setting CUPTI up again after its teardown can crash a process that replays "
        "CUDA graphs, so only the first window runs"
    )


class Instrument:
    """The patches and their records; one per process."""

    def __init__(
        self,
        writer: Writer,
        overrides: dict[str, object],
        stop: Stop | None,
        windows: tuple[int, int, int] | None = None,
    ) -> None:
        self.writer = writer
        self.overrides = overrides
        self.stop = stop
        self.windows = KernelWindows(writer, windows)
        self.loaders = 0
        self.ray_sites: dict[tuple[str, int], int] = {}  # one Ray loader per call site, however many epochs
        self.calls: collections.Counter[int] = collections.Counter()
        self.runq = RunQueue()
        self.device = DeviceClock(writer)

    def start(self) -> None:
        self.writer.put({"k": "proc", "pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, **_rank_env()})

    def patch_dataloader(self, module: ModuleType) -> None:
        """Wrap DataLoader.__init__ / __iter__ and _BaseDataLoaderIter.__next__ in the module just imported."""
        missing = [n for n in ("DataLoader", "_BaseDataLoaderIter") if not hasattr(module, n)]
        if missing:
            self.aside(f"torch.utils.data.dataloader has no {', '.join(missing)}")
            return
        loader_cls, iter_cls = module.DataLoader, module._BaseDataLoaderIter
        init, it, nxt = loader_cls.__init__, loader_cls.__iter__, iter_cls.__next__
        try:
            signature = inspect.signature(init)
        except (TypeError, ValueError) as exc:
            self.aside(f"cannot read DataLoader.__init__'s signature: {exc}")
            return
        loader_cls.__init__ = self._init(init, signature)
        loader_cls.__iter__ = self._iter(it)
        iter_cls.__next__ = self._next(nxt)

    def patch_dali(self, module: ModuleType) -> None:
        """Wrap DALIGenericIterator (and so DALIClassificationIterator): it is its own loader and iterator."""
        cls = getattr(module, "DALIGenericIterator", None)
        if cls is None:
            self.aside("nvidia.dali.plugin.pytorch has no DALIGenericIterator")
            return
        init, it, nxt = cls.__init__, cls.__iter__, cls.__next__
        cls.__init__ = self._dali_init(init)
        cls.__iter__ = self._iter(it)
        cls.__next__ = self._next(nxt)

    def patch_torchdata(self, module: ModuleType) -> None:
        """Wrap torchdata.nodes' Loader (its site and the knobs of its graph) and LoaderIterator.__next__."""
        missing = [n for n in ("Loader", "LoaderIterator") if not hasattr(module, n)]
        if missing:
            self.aside(f"torchdata.nodes.loader has no {', '.join(missing)}")
            return
        loader_cls, iter_cls = module.Loader, module.LoaderIterator
        loader_cls.__init__ = self._nodes_init(loader_cls.__init__)
        loader_cls.__iter__ = self._iter(loader_cls.__iter__)
        iter_cls.__next__ = self._next(iter_cls.__next__)

    def patch_ray(self, module: ModuleType) -> None:
        """Wrap Ray Data's ``DataIterator._iter_batches``, which ``iter_batches`` and ``iter_torch_batches`` of a
        Dataset or a DataIterator all return: each call is an epoch of the loader named by its call site (one
        loader per site, however many epochs), its batches timed by the same ``next()`` records as a DataLoader's
        (stallscope_ray.py beside this file)."""
        cls = getattr(module, "DataIterator", None)
        if cls is None or not hasattr(cls, "_iter_batches"):
            self.aside("ray.data.iterator has no DataIterator._iter_batches")
            return
        ray = sibling("stallscope_ray")
        ray.RayEpoch.__iter__ = self._iter(ray.RayEpoch.__iter__)
        ray.RayEpochIterator.__next__ = self._next(ray.RayEpochIterator.__next__)
        cls._iter_batches = ray.wrap_iter_batches(cls._iter_batches, self.ray_loader, self.writer)

    def ray_loader(self, kwargs: dict[str, Any]) -> int:
        """The loader of the Ray iterator built at the caller's call site: its id, its record written once."""
        site = call_site()
        lid = self.ray_sites.get(site)
        if lid is None:
            self.loaders += 1
            self.ray_sites[site] = lid = self.loaders
            knob = {k: kwargs.get(k) for k in ("batch_size", "prefetch_batches")}
            rec = {"k": "loader", "id": lid, "file": site[0], "line": site[1], "args": knob, "applied": {}}
            self.writer.put({**rec, "kind": "ray.data.DataIterator"})
        return lid

    def _nodes_init(self, init: Callable[..., None]) -> Callable[..., None]:
        inst = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            init(loader, *args, **kwargs)
            inst.loaders += 1
            loader._stallscope_id = lid = inst.loaders
            path, line = call_site()
            args = sibling("stallscope_knobs").node_knobs(loader)
            rec = {"k": "loader", "id": lid, "file": path, "line": line, "args": args, "applied": {}}
            inst.writer.put({**rec, "kind": "torchdata.nodes.Loader"})

        return __init__

    def _dali_init(self, init: Callable[..., None]) -> Callable[..., None]:
        inst = self

        def __init__(iterator: Any, *args: Any, **kwargs: Any) -> None:
            init(iterator, *args, **kwargs)  # its first batch may be prepared here: a call of loader 0, ignored
            inst.loaders += 1
            iterator._stallscope_id = lid = inst.loaders
            path, line = call_site()
            args = sibling("stallscope_knobs").dali_knobs(iterator)
            rec = {"k": "loader", "id": lid, "file": path, "line": line, "args": args, "applied": {}}
            inst.writer.put({**rec, "kind": type(iterator).__name__})

        return __init__

    def aside(self, why: str) -> None:
        sys.stderr.write(f"stallscope: instrumentation steps aside ({why}); the py-spy estimate goes on\n")
        self.writer.put({"k": "aside", "why": why})

    def _init(self, init: Callable[..., None], signature: inspect.Signature) -> Callable[..., None]:
        inst = self

        def __init__(loader: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(loader, *args, **kwargs)
            applied = apply_overrides(bound.arguments, inst.overrides)
            init(*bound.args, **bound.kwargs)
            inst.loaders += 1
            lid = inst.loaders
            loader._stallscope_id = lid
            path, line = call_site()
            rec = {"k": "loader", "id": lid, "file": path, "line": line, "args": knobs(loader), "applied": applied}
            inst.writer.put({**rec, "kind": "DataLoader"})

        return __init__

    def _iter(self, it: Callable[[Any], Any]) -> Callable[[Any], Any]:
        writer, runq, dev = self.writer, self.runq, self.device

        def __iter__(loader: Any) -> Any:
            q0, t0 = runq.read(), time.perf_counter()
            m0 = dev.mark()
            iterator = it(loader)
            lid = getattr(loader, "_stallscope_id", 0)
            try:
                iterator._stallscope_id = lid
            except AttributeError:
                return iterator
            rec = {"k": "iter", "id": lid, "t0": t0, "t1": time.perf_counter(), "q0": q0}
            if m0 is not None:
                rec["m0"] = m0
            writer.put(rec)
            return iterator

        return __iter__

    def _next(self, nxt: Callable[[Any], Any]) -> Callable[[Any], Any]:
        writer, calls, clock, runq, dev = self.writer, self.calls, time.perf_counter, self.runq, self.device
        kw = self.windows

        def __next__(iterator: Any) -> Any:
            # the clock is read first and last: the call's time, as the script sees it, includes this wrapper
            t0, q0 = clock(), runq.read()
            lid = getattr(iterator, "_stallscope_id", 0)
            m0 = dev.mark()
            try:
                batch = nxt(iterator)
            except StopIteration:
                writer.put({"k": "end", "id": lid, "t0": t0, "t1": clock(), "q0": q0, "m0": m0})
                raise
            m1 = dev.mark()
            rec = {"k": "next", "id": lid, "t0": t0, "q0": q0, "q1": runq.read(), "n": batch_len(batch)}
            if m0 is not None and m1 is not None:
                rec["m0"], rec["m1"] = m0, m1
            calls[lid] += 1
            rec["t1"] = t1 = clock()
            writer.put(rec)
            if calls[lid] >= kw.next_call:  # a kernel window is due (one compare a call otherwise)
                kw.at(calls[lid])
            why = self.stop.due(lid, calls[lid], t1) if self.stop is not None else None
            if why is not None:
                writer.put({"k": "stop", "id": lid, "t": t1, "why": why})
                raise SystemExit(0)
            return batch

        return __next__


def knobs(loader: Any) -> dict[str, object]:
    """The loader's knobs and its sampler's kind, as built."""
    out = {k: getattr(loader, k, None) for k in KNOBS}
    sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(sampler, "sampler", None)
    out["sampler"] = type(inner if inner is not None else getattr(loader, "sampler", None)).__name__
    out["dataset"] = type(getattr(loader, "dataset", None)).__name__
    return {k: v if isinstance(v, (int, float, str, bool)) or v is None else repr(v) for k, v in out.items()}


def apply_overrides(arguments: dict[str, object], overrides: dict[str, object]) -> dict[str, object]:
    """Set the overridden knobs in a bound DataLoader call; the values applied. Knobs that need workers
    (prefetch_factor, persistent_workers) are dropped when the workers are overridden to 0."""
    applied = {k: v for k, v in overrides.items() if k in KNOBS}
    if applied.get("pin_memory") == "auto":
        if _cuda_available():
            applied["pin_memory"] = True
        else:
            del applied["pin_memory"]
    arguments.update(applied)
    if applied.get("num_workers") == 0:
        for k in ("prefetch_factor", "persistent_workers"):
            if k in arguments:
                arguments[k] = None if k == "prefetch_factor" else False
    return applied


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a torch without a working CUDA query: no pinning asked for
        return False


def _rank_env() -> dict[str, object]:
    out: dict[str, object] = {}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"):
        value = os.environ.get(key)
        if value is not None and value.isdigit():
            out[key.lower()] = int(value)
    return out


class PostImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` right after the module ``name`` executes, whoever imports it."""

    def __init__(self, name: str, patch: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.patch = patch

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = Patching(spec.loader, self.patch)
        return spec


class Patching(importlib.abc.Loader):
    def __init__(self, inner: Any, patch: Callable[[ModuleType], None]) -> None:
        self.inner = inner
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self.inner.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        self.patch(module)


def install() -> Instrument | None:
    """Set up from the environment; None when stallscope did not ask for instrumentation."""
    directory = os.environ.get(DIR_ENV)
    if not directory or not os.path.isdir(directory):
        return None
    try:
        overrides = json.loads(os.environ.get(OVERRIDES_ENV) or "{}")
        stop = Stop.parse(os.environ.get(STOP_ENV))
        windows = KernelWindows.parse(os.environ.get(WINDOWS_ENV))
    except ValueError as exc:
        sys.stderr.write(
            f"stallscope: instrumentation steps aside (bad {OVERRIDES_ENV}/{STOP_ENV}/{WINDOWS_ENV}: {exc})\n"
        )
        return None
    writer = Writer(directory)
    os.register_at_fork(after_in_child=writer.forked)
    inst = Instrument(writer, overrides if isinstance(overrides, dict) else {}, stop, windows)
    inst.start()
    atexit.register(writer.flush)
    atexit.register(inst.windows.finish)  # a stop still running on the window thread writes its record first
    atexit.register(inst.device.close)  # runs first (atexit is last-in, first-out): its records then flush
    for name, patch in (
        ("torch.utils.data.dataloader", inst.patch_dataloader),
        ("nvidia.dali.plugin.pytorch", inst.patch_dali),
        ("torchdata.nodes.loader", inst.patch_torchdata),
        ("ray.data.iterator", inst.patch_ray),
    ):
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            sys.meta_path.insert(0, PostImport(name, patch))
    return inst
