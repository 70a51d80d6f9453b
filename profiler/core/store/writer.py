"""The writer side of ``run.sqlite``: producers queue rows, one thread commits them every ``flush_s``."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import queue
import resource
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from profiler.core.rows import KernelWindow, PhaseRow, RunRecord, StepRow
from profiler.core.store.lock import lock_run_dir, make_dir, no_world_write, unlock_run_dir
from profiler.core.store.reader import open_read, read_rows, read_stacks
from profiler.core.store.schema import (
    DB_NAME,
    ERROR_NAME,
    PHASE_COLS,
    SCHEMA,
    SCHEMA_VERSION,
    STEP_COLS,
    WINDOW_COLS,
    StoreError,
    add_columns,
)

SampleRow = tuple[float, str, str, float | None]
EventRow = tuple[float, str, str | None, str]  # t, kind, source, message
_Item = (  # what producers queue for the writer thread
    tuple[Literal["step"], StepRow, Sequence[PhaseRow]]
    | tuple[Literal["samples"], list[SampleRow]]
    | tuple[Literal["event"], EventRow]
    | tuple[Literal["meta"], list[tuple[str, str]]]  # each key with its JSON
    | tuple[Literal["mark"], list[int]]  # a mark of the sampler process's ring: committed with the rows before it
    | tuple[Literal["window"], KernelWindow]
)
MARK_KEY = "ring_pos"  # meta: the ring position up to which the rows are committed (the sampler process's)


class StoreWriteError(Exception):
    """The run store could not be written (disk full, over quota, the file size limit, the directory removed).

    ``last_kept`` is the last step the store holds (-1: none); everything committed before the failure is kept.
    """

    def __init__(self, message: str, path: Path, last_kept: int) -> None:
        super().__init__(message)
        self.path = path
        self.last_kept = last_kept

    @property
    def kept(self) -> str:
        """What the store kept, in the words every message about a stopped store uses."""
        return f"steps up to {self.last_kept} kept" if self.last_kept >= 0 else "no step kept"

    def at_step(self, step: int) -> StoreWriteError:
        """This failure as the error that stops the training before ``step`` (``store_errors="raise"``)."""
        return StoreWriteError(f"{self}; stopped at step {step}, {self.kept}", self.path, self.last_kept)


def init_store(run_dir: Path, meta: Mapping[str, object]) -> None:
    """Create ``run_dir``'s store (schema and ``meta``) and return at once, with no writer: the training process
    of a run whose sampler process writes the rows (:mod:`profiler.core.sampler_process`), so that a reader never sees a
    store without its meta. The caller holds the run directory's lock."""
    make_dir(run_dir)
    path = run_dir / DB_NAME
    con = connect(path)
    try:
        with con:
            _create(con, meta)
    finally:
        con.close()
    for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm"):
        no_world_write(run_dir / name)


def _create(con: sqlite3.Connection, meta: Mapping[str, object]) -> None:
    con.executescript(SCHEMA)
    add_columns(con)
    con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    con.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])


def connect(path: Path) -> sqlite3.Connection:
    con = sqlite3.connect(path, check_same_thread=False, timeout=10.0)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    return con


class RunStore:
    """Writer side of a run directory's ``run.sqlite``."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        flush_s: float = 0.5,
        meta: Mapping[str, object] | None = None,
        on_error: Callable[[StoreWriteError], None] | None = None,
        lock: bool = True,
        on_commit: Callable[[list[int]], None] | None = None,
    ) -> None:
        """Create the schema and write ``meta`` before returning: a reader never sees a store without it.
        RunDirBusy when another live store writes ``run_dir``. ``on_error`` is called once, on the writer
        thread, when a write fails (see the module docstring). ``lock=False``: the caller's process does not
        claim the directory, because the process it writes for holds the claim (the sampler process writes
        for the training process); ``on_commit`` is told the newest :meth:`put_mark` mark each commit
        holds, after the commit."""
        if not 0 < flush_s <= 1.0:
            raise ValueError(f"flush_s must be in (0, 1], got {flush_s}")
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        make_dir(self.run_dir)
        self._locks = lock
        if lock:
            lock_run_dir(self.run_dir, store=True)
        try:
            self._con = connect(self.path)
            with self._con:
                _create(self._con, meta or {})
            self._ino = self.path.stat().st_ino
        except BaseException:
            if lock:
                unlock_run_dir(self.run_dir)
            raise
        for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm"):
            no_world_write(self.run_dir / name)
        self._flush_s = flush_s
        self._on_error = on_error
        self._on_commit = on_commit
        self._q: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._kept = -1  # the last step committed
        self._failure: StoreWriteError | None = None
        # Only the meta table is mirrored in memory (a few keys): the rows are read back from the store when the
        # record is asked for (at close), so stallscope's memory does not grow with the run's length.
        self._meta: dict[str, object] = {"schema_version": SCHEMA_VERSION, **json.loads(json.dumps(meta or {}))}
        self._late_events: list[EventRow] = []  # put after the writer stopped
        self._final: RunRecord | None = None  # a stopped store's committed rows, read before its file closed
        self._error: BaseException | None = None
        self._dead = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallscope-store", daemon=True)
        self._closed = False
        self._thread.start()

    # -- producer side (any thread) ------------------------------------------------------------
    def put_meta(self, **items: object) -> None:
        encoded = [(k, json.dumps(v)) for k, v in items.items()]
        self._meta.update((k, json.loads(v)) for k, v in encoded)
        if not self._dead:
            self._q.put(("meta", encoded))

    def put_step(self, row: StepRow, phases: Sequence[PhaseRow] = ()) -> None:
        if not self._dead:
            self._q.put(("step", row, phases))

    def put_samples(self, rows: Iterable[SampleRow]) -> None:
        batch = list(rows)
        if not self._dead:
            self._q.put(("samples", batch))

    def put_window(self, window: KernelWindow) -> None:
        """A kernel window and its activities; one already stored (a reader that took over reads its events
        again) is not stored twice."""
        if not self._dead:
            self._q.put(("window", window))

    def put_mark(self, mark: list[int]) -> None:
        """A ring mark (:mod:`profiler.core.sampler_process.drain`: position, resume position, step): the rows put
        before it are committed with it as meta ``ring_pos``, in one transaction, and ``on_commit`` hears of it
        after."""
        if not self._dead:
            self._q.put(("mark", mark))

    def put_event(self, t: float, kind: str, message: str, source: str | None = None) -> None:
        if self._dead:
            self._late_events.append((t, kind, source, message))
        else:
            self._q.put(("event", (t, kind, source, message)))

    def steps(self) -> list[StepRow]:
        """The step rows the store holds, in order: read back from the file (while the run goes on, those
        committed so far, at most ``flush_s`` behind; after close, every step, or for a store that stopped
        writing, every step it kept)."""
        return self.record().steps

    def record(self) -> RunRecord:
        """Everything the run put, as :func:`load_run` would read it back (py-spy's stacks from their file):
        what Session and zero-code summarise at close. The rows are read back from the store, which is the
        truth (nothing but the meta table is kept in memory, so memory stays flat however long the run):
        after close, every row; while running, the rows committed so far. A store that stopped writing
        (:attr:`failure`) gives the rows it committed before the failure, read at close even when its file
        was removed, with the meta and the events put since."""
        final = self._final
        if final is None:
            final = self._read_file()
        return RunRecord(
            dict(self._meta),
            final.steps,
            final.phases,
            final.samples,
            sorted([*final.events, *self._late_events], key=lambda e: e[0]),
            read_stacks(self.run_dir),
            final.windows,
        )

    def _read_file(self) -> RunRecord:
        """The committed rows, through a read connection of our own (the writer's belongs to its thread)."""
        try:
            con = open_read(self.path)
        except StoreError:
            return RunRecord({}, [], [], [], [])
        try:
            return read_rows(con, {})
        except sqlite3.DatabaseError:
            return RunRecord({}, [], [], [], [])
        finally:
            con.close()

    @property
    def error(self) -> BaseException | None:
        """An exception that stopped the writer (disk full, unwritable), else None."""
        return self._error

    @property
    def failure(self) -> StoreWriteError | None:
        """Why the store stopped writing (one line, and the last step it kept), else None."""
        return self._failure

    def close(self) -> None:
        """Flush everything queued, commit, checkpoint the WAL. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(timeout=30)
        if self._failure is not None:  # its file may be gone: keep what it committed, read through its connection
            try:
                self._final = read_rows(self._con, {})
            except sqlite3.Error:
                self._final = RunRecord({}, [], [], [], [])
        # a checkpoint is an optimisation; the WAL is still valid without it
        with contextlib.suppress(sqlite3.Error):
            self._con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._con.close()
        if self._locks:
            unlock_run_dir(self.run_dir)

    # -- writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        # Wake on a timer, not per item: a wake-up per training step costs the step a context switch
        # (measurable on 2 cores next to torch's intra-op threads); one per flush interval does not.
        con = self._con
        stopping = False
        while not stopping:
            stopping = self._stop.wait(self._flush_s)
            items: list[_Item] = []
            while True:
                try:
                    items.append(self._q.get_nowait())
                except queue.Empty:
                    break
            if not items:
                continue
            try:
                self._check_file()
                self._commit(con, items)
            except OSError as exc:  # the file is gone: keep the reason, stop writing
                self._fail(con, exc)
                return
            except sqlite3.Error as exc:  # disk full, over quota, the file size limit
                if not self._retry(con, items):
                    self._fail(con, exc)
                    return
            items.clear()  # written: not held while the thread waits for the next flush

    def _commit(self, con: sqlite3.Connection, items: list[_Item]) -> None:
        kept, mark = self._kept, None
        for item in items:
            if item[0] == "mark":
                mark = item[1]
                continue
            self._apply(con, item)
            if item[0] == "step":
                kept = max(kept, item[1].step)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)", (json.dumps(time.time()),))
        if mark is not None:
            con.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (MARK_KEY, json.dumps(mark)))
        con.commit()
        self._kept = kept
        if mark is not None and self._on_commit is not None:
            self._on_commit(mark)

    def _retry(self, con: sqlite3.Connection, items: list[_Item]) -> bool:
        """After a failed commit: fold the WAL into the file (the WAL grows to ~4 MB between checkpoints, so a
        file size limit or a nearly full disk can stop it while the file itself still has room) and try the
        same rows once more. False when that fails too."""
        try:
            con.rollback()
            busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            if busy:
                return False
            self._commit(con, items)
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                con.rollback()
            return False
        return True

    def _check_file(self) -> None:
        """OSError when ``run.sqlite`` is no longer the file this store writes (its directory was removed or
        replaced): SQLite would go on writing the unlinked file, and nothing would be kept."""
        try:
            ino = self.path.stat().st_ino
        except FileNotFoundError:
            raise OSError(errno.ENOENT, f"the run directory was removed (no {DB_NAME} in it)") from None
        if ino != self._ino:
            raise OSError(errno.ENOENT, f"{DB_NAME} was replaced by another file")

    def _fail(self, con: sqlite3.Connection, exc: BaseException) -> None:
        """Stop writing for good: roll back, mark the store failed where the disk still allows, tell once."""
        self._error = exc
        self._dead = True  # producers stop queueing; nothing grows without bound
        # the connection itself may be broken; the error above is what matters
        with contextlib.suppress(sqlite3.Error):
            con.rollback()
        message = f"could not write the run store {self.path}: {write_failure(self.path, exc)}"
        self._failure = failure = StoreWriteError(message, self.path, self._kept)
        if not isinstance(exc, OSError):  # the file is still ours: record why it stopped, where it fits
            self._mark_failed(con, message)
        if self._on_error is not None:
            self._on_error(failure)

    def _mark_failed(self, con: sqlite3.Connection, message: str) -> None:
        """``status: failed`` and the reason in meta; when even that does not fit (the WAL and the file both
        full), in ``store-error.txt`` beside the store, which the readers apply to a store still ``running``."""
        with contextlib.suppress(sqlite3.Error):
            # folding the WAL into the file first frees the WAL's room (the file size limit is per file)
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        try:
            with con:
                con.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [("status", json.dumps("failed")), ("error", json.dumps(message))],
                )
        except sqlite3.Error:
            side = self.run_dir / ERROR_NAME
            with contextlib.suppress(OSError):
                side.write_text(message + "\n")
                no_world_write(side)

    @staticmethod
    def _apply(con: sqlite3.Connection, item: _Item) -> None:
        if item[0] == "step":
            row, phases = item[1], item[2]
            con.execute(
                f"INSERT OR REPLACE INTO steps ({STEP_COLS}) VALUES (?,?,?,?,?,?,?,?)",
                (
                    *(row.step, row.t_start, row.t_end, row.data_wait_s, row.samples, int(row.warmup)),
                    *(row.data_wait_runq_s, row.runq_s),
                ),
            )
            if phases:
                con.executemany(
                    f"INSERT INTO phases ({PHASE_COLS}) VALUES (?,?,?,?,?,?,?,?)",
                    [(p.step, p.name, p.depth, p.t_start, p.t_end, p.dev_start, p.dev_end, p.runq_s) for p in phases],
                )
            return
        if item[0] == "samples":
            con.executemany("INSERT INTO samples VALUES (?,?,?,?)", item[1])
            return
        if item[0] == "event":
            con.execute("INSERT INTO events VALUES (?,?,?,?)", item[1])
            return
        if item[0] == "meta":
            con.executemany("INSERT OR REPLACE INTO meta VALUES (?,?)", item[1])
            return
        if item[0] == "window":
            w = item[1]
            rec = None if math.isnan(w.recorded_end) else w.recorded_end
            cur = con.execute(f"INSERT OR IGNORE INTO kernel_windows ({WINDOW_COLS}) VALUES (?,?,?,?,?)",
                              (w.window, w.t_start, w.t_end, w.cost_s, rec))  # fmt: skip
            if cur.rowcount == 1:
                con.executemany(
                    "INSERT INTO kernels VALUES (?,?,?,?,?,?)",
                    [(w.window, s, k, a, b, None if c != c else c) for s, k, a, b, c in w.activities],  # noqa: PLR0124
                )
            return
        raise AssertionError(f"unknown store item {item[0]!r}")


def write_failure(path: Path, exc: BaseException) -> str:
    """What stopped the writes of ``path``, in words a user can act on: the file size limit, a full disk, a
    removed directory, else SQLite's or the OS's own words."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    size = max((_size(path.with_name(path.name + sfx)) for sfx in ("", "-wal", "-journal")), default=0)
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY and size + 65536 >= limit:
        return f"file too large: the file size limit (ulimit -f) of {limit} bytes was reached"
    if not path.parent.is_dir():
        return "the run directory was removed"
    with contextlib.suppress(OSError):
        vfs = os.statvfs(path.parent)
        if vfs.f_bavail * vfs.f_frsize < 1 << 20:
            return f"the disk is full ({exc})"
    if getattr(exc, "sqlite_errorname", "") in ("SQLITE_FULL", "SQLITE_IOERR_WRITE"):
        return f"{exc} (disk full or over quota)"
    return str(exc)


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0
