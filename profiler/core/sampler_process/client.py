"""The training process's side of a run recorded by a sampler process: :class:`ProcessRecorder`, the recorder hook
``Session`` uses by default (docs/architecture.md, "Two processes").

What stays in the training process: the run directory's lock, the store's creation (schema and meta, before the
first step), the Session's step events into the ring (:mod:`profiler.core.sampler_process.ring`), and one watch
thread that wakes once a second. Sources that can only be read from inside this process (the pin-memory thread, a user's
own source objects) run on an in-process sampler; those a recipe names run in the sampler process.

Invariants:
- Training never waits for the sampler process: a step's events are appended to an array (one C call each) and
  copied into shared memory in batches; a ring that is full grows by a segment sent to the sampler process over a
  socket (where it cannot, the record waits in a spill list), so what was handed on outlives a kill of this process.
- The header counts the steps taken (the Session's step clock stores it); the sampler process, or this process after
  a take-over, stores it at the close as meta ``steps_taken``.
- The sampler process dies (or hangs at close): the watch sees it within a second and this process takes the
  store over (the lock is already its own), resuming from the ring position the store last committed, so no
  step is lost; the store says when and how the sampler process ended, and that samples stop there.
- ``close()`` tells the sampler process, waits for it (bounded), then builds the Summary from the store.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.core.recorders.in_thread import (
    Summarizer,
    checked_store_errors,
    log_warning,
    running_meta,
    store_failed_line,
)
from profiler.core.rows import PhaseRow, RunRecord, StepRow
from profiler.core.sampler_process.drain import Drain
from profiler.core.sampler_process.ring import DEFAULT_SIZE, Ring, RingReader, RingWriter, send_segment
from profiler.core.sampler_process.views import ViewRecipe
from profiler.core.sampler_process.wire import (
    Close,
    Final,
    Log,
    Meta,
    PySpy,
    ReadMemory,
    Ready,
    Rescan,
    RunEvent,
    Samples,
    heard,
)
from profiler.core.sampling.on_training_thread import TickReads
from profiler.core.sampling.sampler import Sampler
from profiler.core.sources.base import Recipe, Source, SourceRecipe, split_recipes
from profiler.core.sources.memory import Taken
from profiler.core.steps.events import Assembler, EventSink
from profiler.core.store import (
    DB_NAME,
    RunStore,
    StoreError,
    StoreWriteError,
    load_run,
    lock_run_dir,
    make_dir,
    unlock_run_dir,
)
from profiler.core.store.reader import open_read, read_meta
from profiler.core.store.writer import MARK_KEY, init_store

if TYPE_CHECKING:
    from profiler.core.hooks import RunSummary, SessionView

log = logging.getLogger("stallscope")

WATCH_S = 1.0  # the one thread this hook runs in the training process wakes this often
READY_TIMEOUT_S = 30.0  # the sources' probes (NVML's init on a many-GPU machine can take seconds), and the start
CLOSE_TIMEOUT_S = 60.0  # a sampler process that has stored nothing for this long at the close is taken over
_ROOT = str(Path(__file__).resolve().parents[3])  # the directory holding the profiler package


DEFAULT_SOURCES = "profiler.core.recorders.in_thread:default_sources"


def default_recipe(pid: int | None = None, *, nvml: bool = True) -> SourceRecipe:
    """The sources every run samples (:func:`profiler.core.recorders.in_thread.default_sources` of ``pid``'s tree), made
    in the sampler process (``nvml=False``: not NVML)."""
    return SourceRecipe(DEFAULT_SOURCES, pid=os.getpid() if pid is None else pid, nvml=nvml)


def default_local_sources() -> list[Source]:
    """What only the training process can read of itself: the pin-memory threads and the pinned bytes."""
    from profiler.core.sources.pin import PinSource

    return [PinSource()]


def split_sources(
    sources: Sequence[Source | SourceRecipe] | None,
) -> tuple[list[SourceRecipe], list[Source]]:
    """(recipes for the sampler process, source objects for this process); None: the defaults."""
    if sources is None:
        return [default_recipe()], default_local_sources()
    return split_recipes(sources)


class ProcessRecorder:
    """The recorder hook of a Session whose sampling and store run in a sampler process (see the module)."""

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        meta: dict[str, object],
        sample_hz: float,
        sources: Sequence[Source | SourceRecipe] | None = None,
        store_errors: str = "warn",
        warn: Callable[[str], None] = log_warning,
        ring_size: int = DEFAULT_SIZE,
        summarize: Summarizer | None = None,
        on_orphaned: Recipe | None = None,
    ) -> None:
        """``summarize``: what builds the Summary at close (``profiler.runs.summarize.summarize_run``, passed in by the
        layers above: the core imports no analysis); None: no Summary. ``on_orphaned``: what the sampler process
        calls with the run directory after closing the store of a training process that is gone (killed): the
        report cache, built there, where no one waits for it."""
        self.out_dir = Path(out_dir)
        self._meta = meta
        self._sample_hz = sample_hz
        self._recipes, self._local = split_sources(sources)
        self._store_errors = checked_store_errors(store_errors)
        self._warn = warn
        self._ring_size = ring_size
        self._summarizer = summarize
        self._on_orphaned = on_orphaned
        self.t0 = 0.0
        self.sampler: Sampler | None = None  # the in-process sources' sampler (None without any)
        self._ticked: TickReads | None = None  # those read at the training thread's hand-overs
        self.proc: subprocess.Popen[bytes] | None = None
        self._ring: Ring | None = None
        self._writer: RingWriter | None = None
        # the ring's new segments go to the sampler process over this socket (ours; its end is passed at the spawn)
        self._segments: socket.socket | None = None
        self._watch: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()  # the take-over and the close
        self._drain: Drain | None = None  # this process's own drain, once it took the store over
        self._lost: str | None = None
        self.watch_rounds = 0  # the watch thread's wake-ups so far (tests/test_sampler_process.py counts them)
        self.watch_errors = 0  # the watch thread's rounds that raised (counted, never raised)
        self.watch_error: str | None = None  # the first of them
        self._ready = False
        self._final: str | None = None  # a stopped store's rows, pickled by the sampler process (its file may be gone)
        self._said = b""  # a part line of what the sampler process said
        self._summary: RunSummary | None = None
        self._closed = False
        self._views: list[ViewRecipe] = []
        self._fallbacks: list[Callable[[], object]] = []

    # -- start -----------------------------------------------------------------------------------------------
    def add_views(self, recipes: Sequence[ViewRecipe], fallback: Callable[[], object]) -> bool:
        """Views the sampler process serves while the run records (given before the start): True. ``fallback()``
        is called (once) where it does not or no longer can: it did not start, or it was lost mid-run. It then
        shows the same views from this process."""
        if self.proc is not None:
            raise RuntimeError("views are given before the sampler process starts")
        self._views.extend(recipes)
        self._fallbacks.append(fallback)
        return True

    @property
    def serving_views(self) -> bool:
        """The sampler process started, and serves the views it was given (it has not been lost)."""
        return bool(self._views) and self._ready and self._lost is None

    def on_start(self, session: SessionView) -> None:
        self._meta = session.meta
        self.start(session.t0)

    def start(self, t0: float) -> None:
        """Claim the run directory, create the store with its meta, start the sampler process and the watch."""
        self.t0 = t0
        make_dir(self.out_dir)
        lock_run_dir(self.out_dir, store=True)
        try:
            init_store(self.out_dir, running_meta(self._meta, self._sample_hz, sampling="process"))
            self._ring = ring = Ring.create(self._ring_size)
            self._segments, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self._segments.setblocking(False)  # a segment that cannot go at once is not sent: the record spills
            ours = self._segments
            self._writer = RingWriter(ring, announce=lambda seg: send_segment(ours, seg))
            try:
                self.proc = proc = self._spawn(ring, t0, theirs.fileno())
            finally:
                theirs.close()  # the sampler process has its own; ours alone here, so its end is seen
        except BaseException:
            if self._segments is not None:
                self._segments.close()
            if self._ring is not None:
                self._ring.close()
            unlock_run_dir(self.out_dir)
            raise
        problem = self._await_ready(proc)
        if problem is not None:  # the run is recorded all the same: this process writes the store, unsampled
            with self._lock:
                self._take_over(problem)
            self._views_here()
        writer = self._writer
        # the pin source's kind is read at the training thread's hand-overs, with no thread of its own
        # (core.sampling.on_training_thread)
        ticked = [s for s in self._local if getattr(s, "at_ticks", False)]
        self._ticked = TickReads(
            ticked,
            sink=lambda rows: writer.put_item(Samples(rows)),
            on_event=lambda t, kind, message, source: writer.put_item(RunEvent(t, kind, source, message)),
            now=self.now,
        )
        if threaded := [s for s in self._local if s not in ticked]:
            # as fast as the fastest of them needs: a source with a ``max_hz`` asks for less
            hz = max(min(self._sample_hz, getattr(s, "max_hz", self._sample_hz)) for s in threaded)
            self.sampler = Sampler(
                threaded, hz,
                sink=lambda rows: writer.put_item(Samples(rows)),
                on_event=lambda t, kind, message, source: writer.put_item(RunEvent(t, kind, source, message)),
                t0=t0,
                health_rows=False,
            )  # fmt: skip
            self.sampler.start()
        self._watch = threading.Thread(target=self._watch_loop, name="stallscope-watch", daemon=True)
        self._watch.start()

    def _spawn(self, ring: Ring, t0: float, segments_fd: int) -> subprocess.Popen[bytes]:
        orders = {
            "parent_pid": os.getpid(), "fd": ring.fd, "size": ring.size, "segments_fd": segments_fd,
            "run_dir": str(self.out_dir), "sample_hz": self._sample_hz, "t0": t0, "warmup": self._warmup(),
            "store_errors": self._store_errors,
            "recipes": [r.to_json() for r in self._recipes],
            "on_orphaned": self._on_orphaned.to_json() if self._on_orphaned is not None else None,
            "views": [v.to_json() for v in self._views], "meta": self._meta if self._views else {},
            # its warnings go to stderr as this process's would: at the stallscope logger's level, or none
            "log_level": max(log.getEffectiveLevel(), logging.root.manager.disable + 1),
        }  # fmt: skip
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        fds = [ring.fd, segments_fd, *(fd for r in self._recipes for fd in r.pass_fds)]
        fds += [fd for v in self._views for fd in v.pass_fds]
        proc = subprocess.Popen(
            [sys.executable, "-m", "profiler.core.sampler_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, pass_fds=fds,
        )  # fmt: skip
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(orders).encode() + b"\n")
            proc.stdin.flush()  # and held open: its end is how the sampler process knows this Session still exists
        except BrokenPipeError:  # it ended at once: _await_ready says how
            pass
        return proc

    def _await_ready(self, proc: subprocess.Popen[bytes]) -> str | None:
        """Wait for the sampler process's ``ready`` (its sources open: as long as their probes take, bounded),
        logging its warnings before it; None when it came, else what went wrong."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        os.set_blocking(fd, False)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not self._ready:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                proc.kill()
                proc.wait()
                return f"did not start within {READY_TIMEOUT_S:g} s"
            if not self._relay():
                proc.wait()
                return f"failed to start ({_exit_words(proc.returncode)}; its error is on stderr above)"
        return None

    def _relay(self) -> bool:
        """Read what the sampler process said (without waiting): ``ready``, and warnings, logged here as this
        process's own. False at its end (the pipe closed)."""
        proc = self.proc
        if proc is None or proc.stdout is None or proc.stdout.closed:
            return False
        try:
            chunk = os.read(proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return True
        if not chunk:
            proc.stdout.close()
        self._said += chunk
        *lines, self._said = self._said.split(b"\n")
        for raw in lines:
            said = heard(raw)
            if isinstance(said, Ready):
                self._ready = True
            elif isinstance(said, Log):
                log.log(said.level, "%s", said.message)
            elif isinstance(said, Final):
                self._final = said.path
        return bool(chunk)

    def _warmup(self) -> int:
        warmup = self._meta.get("warmup_steps")
        return warmup if isinstance(warmup, int) else 0

    # -- the hook ------------------------------------------------------------------------------------------
    wants_rows = False  # the Session's step events go to the ring as they happen (step_events); no rows here

    def step_events(self) -> EventSink | None:
        """Where the Session puts its step events: the ring (the sampler process, or this process after a
        take-over, makes the rows); None before the start."""
        return self._writer

    def on_meta(self, items: Mapping[str, object]) -> None:
        if self._writer is not None:
            self._writer.put_item(Meta(dict(items)))

    def on_step(self, row: StepRow, phases: Sequence[PhaseRow]) -> None:
        """Not called: ``wants_rows`` is False, and the Session's step events go to the ring (:meth:`step_events`),
        where the sampler process makes the rows. A row given here would have no way into the store."""
        raise TypeError("ProcessRecorder takes a Session's step events (step_events()), not rows")

    def on_event(self, kind: str, message: str) -> None:
        self.event(kind, message, "session")

    def event(self, kind: str, message: str, source: str | None = None) -> None:
        if self._writer is not None:
            self._writer.put_item(RunEvent(self.now(), kind, source, message))

    def annotate(self, **items: Any) -> None:
        self.on_meta(items)

    def on_close(self, status: str, error: str | None) -> None:
        self.close(status, error)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def rescan_soon(self) -> None:
        if self._writer is not None:
            self._writer.put_item(Rescan())
        if self.sampler is not None:
            self.sampler.rescan_soon()

    def at_tick(self) -> None:
        """A hand-over of the Session's step events (on the training thread): the sources read there, when due."""
        if self._ticked:
            self._ticked.at()

    def read_memory_soon(self, taken: Taken | None = None) -> None:
        if self._writer is not None:
            self._writer.put_item(ReadMemory(self.now(), taken or {}))

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None:
        """py-spy on ``pid`` and its subprocesses, run by the sampler process (what it finds goes to the store)."""
        if self._writer is not None:
            self._writer.put_item(PySpy(pid, rate, attach_timeout_s, unavailable))
        return None

    @property
    def failure(self) -> StoreWriteError | None:
        ring = self._ring
        if ring is None or self._closed or not ring.failed():
            return None
        got = ring.failure()
        if got is None:
            return None
        return StoreWriteError(got[0], self.out_dir / DB_NAME, got[1])

    def halt(self, step: int) -> BaseException | None:
        ring = self._ring
        if self._store_errors != "raise" or ring is None or not ring.failed():
            return None
        failure = self.failure
        return failure.at_step(step) if failure is not None else None

    def committed_steps(self) -> list[StepRow]:
        try:
            return load_run(self.out_dir).steps
        except StoreError:
            return []

    @property
    def summary(self) -> RunSummary | None:
        return self._summary

    @property
    def lost(self) -> str | None:
        """How the sampler process ended before the run did (None while it lives or when it closed the run)."""
        return self._lost

    # -- the watch, and the take-over ------------------------------------------------------------------------
    def _watch_loop(self) -> None:
        # This thread lives in the user's process: an error in a round is counted, named once, and the watch goes
        # on (a traceback on the user's stderr, or a watch that stops moving spilled records, would be worse)
        while not self._stop.wait(WATCH_S):
            self.watch_rounds += 1
            try:
                self.check()
            except Exception as exc:  # noqa: BLE001 - anything check() meets must not end the watch
                self.watch_errors += 1
                if self.watch_error is None:
                    self.watch_error = f"{type(exc).__name__}: {exc}"
                    log.warning("stallscope: the Session's watch thread met %s; it goes on", self.watch_error)

    def check(self) -> None:
        """Once a second: move spilled records into the ring; take the store over from a dead sampler process
        (then drain the ring into it)."""
        writer, proc = self._writer, self.proc
        if writer is None or proc is None:
            return
        writer.flush_events()  # a training thread in a long step has not handed its events on since it began
        writer.flush()
        writer.prepare()  # the ring's next segment, should it soon need one
        with self._lock:
            if self._closed:
                return
            self._relay()
            code = proc.poll()
            lost = code is not None and self._drain is None
            if code is not None and lost:
                self._take_over(f"ended with {_exit_words(code)}")
            if self._drain is not None:
                self._drain.once()
        if lost:
            self._views_here()

    def _views_here(self) -> None:
        """The views the sampler process can no longer serve, from this process (each fallback once)."""
        fallbacks, self._fallbacks = self._fallbacks, []
        for fallback in fallbacks:
            try:
                fallback()
            except Exception as exc:  # noqa: BLE001 - a view is not the run
                self._warn(f"a view could not start in the training process: {type(exc).__name__}: {exc}")

    def _take_over(self, how: str) -> None:
        """Write the store from here on, from the ring position it last committed (lock held by this process)."""
        assert self._ring is not None
        at = self.now()
        pid = self.proc.pid if self.proc is not None else None
        self._lost = f"the sampler process (pid {pid}) {how} at {at:.1f} s"
        store = RunStore(self.out_dir, lock=False, on_error=self._store_failed, on_commit=self._ring.committed)
        assert self._writer is not None
        self._writer.grow_here()  # a full ring grows for this process's own drain, which reads the writer's segments
        pos, resume, step = _committed_mark(self.out_dir)
        reader = RingReader(self._ring, resume, self._writer.names(), pos, segments=self._writer)
        self._drain = Drain(reader, store, assembler=Assembler(self.t0, self._warmup(), first_step=step))
        self._drain.once()
        line = f"{self._lost}: no host, process or device samples after that; every step is kept"
        store.put_event(at, "warning", line, "sampler")
        store.put_meta(sampler_lost={"at_s": at, "how": how, "pid": pid})
        self._warn(line)

    def _store_failed(self, failure: StoreWriteError) -> None:
        assert self._ring is not None
        self._ring.set_failure(str(failure), failure.last_kept)
        if self._store_errors == "warn":
            self._warn(store_failed_line(failure))

    # -- close ---------------------------------------------------------------------------------------------
    def close(self, status: str, error: str | None = None) -> RunSummary | None:
        """End the run: the in-process sampler's last reading, the close item, the sampler process's exit (else
        the take-over), then the Summary from the store."""
        if self._closed or self._writer is None:
            return self._summary
        writer, proc = self._writer, self.proc
        local: dict[str, object] = {}
        if self.sampler is not None:
            self.sampler.stop(final=True)
            local = dict(self.sampler.stats.to_meta()["sources"])  # type: ignore[call-overload]
        if self._ticked is not None:
            local.update(self._ticked.close())
            self._ticked = None
        writer.flush_events()
        writer.put_item(Close(status, error, local))
        self._stop.set()
        if self._watch is not None:
            self._watch.join()
        _hand_all(writer, proc)  # before the stdin closes: the sampler process takes a closed pipe for a lost run
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        self._finish(status, error, writer, proc)
        failed = self.failure is not None
        self._closed = True
        assert self._ring is not None
        writer.close()
        if self._segments is not None:
            self._segments.close()
        self._ring.close()
        unlock_run_dir(self.out_dir)
        self._summary = self._summarize(write=not failed)
        return self._summary

    def _finish(self, status: str, error: str | None, writer: RingWriter, proc: subprocess.Popen[bytes] | None) -> None:
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while not writer.flush() and time.monotonic() < deadline and proc is not None and proc.poll() is None:
            time.sleep(0.01)  # the ring was full: the sampler process is making room
        with self._lock:
            if self._drain is None and proc is not None:
                assert self._ring is not None
                if not _exited(proc, self._ring):
                    proc.kill()
                    proc.wait()
                    self._take_over(f"stored nothing for {CLOSE_TIMEOUT_S:g} s and did not close the run")
                elif proc.returncode != 0:
                    self._take_over(f"ended with {_exit_words(proc.returncode)}")
            while self._relay():  # what it said before it ended
                pass
            drain = self._drain
            if drain is not None:  # this process writes the store: what is left, then the status
                while not writer.flush():
                    drain.once()
                drain.once()
                assert self._ring is not None
                drain.store.put_meta(status=status, error=error, ended_at=time.time(), steps_taken=self._ring.taken())
                drain.store.close()

    def _summarize(self, *, write: bool) -> RunSummary | None:
        if self._summarizer is None:
            return None
        return self._summarizer(self._record, self.out_dir, write, self._warn)

    def _record(self) -> RunRecord:
        """The run's rows: read back from the store, or (a store that stopped writing) those the sampler process
        read through its own connection before it closed, which hold even when the directory was removed."""
        final = self._final
        if final is None:
            return load_run(self.out_dir)
        try:
            with open(final, "rb") as f:
                return pickle.load(f)  # type: ignore[no-any-return]  # written by our own sampler process
        finally:
            with contextlib.suppress(OSError):
                os.unlink(final)


def _hand_all(writer: RingWriter, proc: subprocess.Popen[bytes] | None) -> None:
    """Every record still spilled (a loop faster than the sampler process stores its steps) goes into the ring as
    the sampler process makes room, the close item last. How long that takes is the backlog's business: the wait
    ends when all is in, when the sampler process ends, or when it has taken nothing for CLOSE_TIMEOUT_S."""
    left, since = writer.pending(), time.monotonic()
    while not writer.flush() and proc is not None and proc.poll() is None:
        if writer.pending() < left:
            left, since = writer.pending(), time.monotonic()
        elif time.monotonic() - since > CLOSE_TIMEOUT_S:
            return
        time.sleep(0.005)


def _exited(proc: subprocess.Popen[bytes], ring: Ring) -> bool:
    """Wait for the sampler process's exit for as long as it goes on storing (the backlog in the ring's segments
    can be a loop's worth of steps: about 11,000 a second here); False once it has committed nothing for
    CLOSE_TIMEOUT_S."""
    read, since = ring.read_pos(), time.monotonic()
    while True:
        try:
            proc.wait(0.5)
        except subprocess.TimeoutExpired:
            pass
        else:
            return True
        if ring.read_pos() != read:
            read, since = ring.read_pos(), time.monotonic()
        elif time.monotonic() - since > CLOSE_TIMEOUT_S:
            return False


def _committed_mark(run_dir: Path) -> tuple[int, int, int]:
    """The ring mark the store's rows are committed with (:mod:`profiler.core.sampler_process.drain`): the position
    read up to, where the oldest step not yet stored began, and its index; zeros where none was committed yet."""
    db = run_dir / DB_NAME
    con = open_read(db)
    try:
        value = read_meta(con, db).get(MARK_KEY)
    finally:
        con.close()
    if isinstance(value, list) and len(value) == 3 and all(isinstance(v, int) for v in value):
        return value[0], value[1], value[2]
    return 0, 0, 0


def _exit_words(code: int) -> str:
    if code < 0:
        import signal

        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"
