"""The run store: one SQLite file per run, written off the training thread, readable after any crash.

Invariants:
- The file is opened in WAL mode with ``synchronous=NORMAL``: a process killed at any instant (SIGKILL
  included) leaves a database that passes ``PRAGMA integrity_check`` and holds every transaction committed
  before the kill. Power loss is out of scope.
- Only the writer thread touches the write connection. Producers (the training thread, the sampler)
  call ``put_*`` which only appends to a queue: a few hundred nanoseconds, never a disk write.
- The writer wakes every ``flush_s`` (<= 1 s), writes everything queued in one transaction and commits, so
  a crash loses at most that much. ``meta.heartbeat`` is refreshed at each commit; a run whose status is still
  ``running`` but whose pid is gone, or whose heartbeat is stale, was interrupted.
- Schema changes are additive; ``meta.schema_version`` says which tables and columns exist. A store from a newer
  stallscope (a higher version) is refused by the readers rather than misread.
- A write that fails (disk full, over quota, the file size limit, the directory removed) stops the writer for
  good: what was committed stays committed (the failed transaction is rolled back), the store is marked
  ``status: failed`` with the reason where the disk still takes that much, and ``on_error`` is told once.
  Each flush checks that ``run.sqlite`` is still the file it writes: a removed run directory is a failure,
  not a silent write into an unlinked inode.
- One writer per run directory: a ``.stallscope.lock`` file holding a POSIX lock (``lockf``) while a store or a
  CLI run owns the directory; the kernel drops it with the process, so a stale lock never blocks a new run.
- Files and directories are created with the user's umask, except that the world-write bit is always cleared.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import math
import os
import queue
import resource
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import starmap
from operator import attrgetter
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 2  # 2 added phases.runq_s, steps.data_wait_runq_s and steps.runq_s
STALE_HEARTBEAT_S = 10.0  # the writer commits (and refreshes the heartbeat) at least every second
DB_NAME = "run.sqlite"
STACKS_NAME = "pyspy.speedscope.json"  # written by py-spy beside the store; read with it
STACKS_NAMES = (STACKS_NAME, "pyspy.txt")  # speedscope (ordered samples) or raw collapsed stacks
ERROR_NAME = "store-error.txt"  # why the writer stopped, when the store itself had no room left to say it
LOCK_NAME = ".stallscope.lock"  # held (lockf) by the process writing the run directory
READ_TIMEOUT_S = 3.0  # a reader waits this long for a lock (WAL readers are not blocked by the writer's commits)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY,
    t_start REAL NOT NULL,        -- s since run start: the loop asked for this step's batch
    t_end REAL NOT NULL,          -- s since run start: the loop asked for the next batch
    data_wait_s REAL NOT NULL,    -- host time blocked in next() on the loader
    samples INTEGER,              -- items in the batch (NULL: unknown)
    warmup INTEGER NOT NULL,      -- 1 for warm-up steps, excluded from the summary
    data_wait_runq_s REAL,        -- v2: training thread's run-queue wait inside next() (NULL: not measured)
    runq_s REAL                   -- v2: training thread's run-queue wait over the whole step
);
CREATE TABLE IF NOT EXISTS phases (
    step INTEGER NOT NULL,
    name TEXT NOT NULL,           -- "h2d", "compute", or a user name; nested phases as "outer/inner"
    depth INTEGER NOT NULL,       -- 0 for top-level phases (only those enter the breakdown)
    t_start REAL NOT NULL,        -- host perf_counter, s since run start
    t_end REAL NOT NULL,
    dev_start REAL,               -- device (CUDA event) time on the same timeline; NULL on CPU
    dev_end REAL,
    runq_s REAL                   -- v2: training thread's run-queue wait inside the phase (schedstat)
);
CREATE INDEX IF NOT EXISTS phases_step ON phases(step);
CREATE TABLE IF NOT EXISTS samples (
    t REAL NOT NULL,              -- s since run start, when the reading was taken
    source TEXT NOT NULL,         -- "host", "nvml", "sampler"
    metric TEXT NOT NULL,
    value REAL                    -- NULL: the metric could not be read at this instant
);
CREATE INDEX IF NOT EXISTS samples_metric ON samples(metric, t);
CREATE TABLE IF NOT EXISTS events (
    t REAL NOT NULL,
    kind TEXT NOT NULL,           -- "source", "source_error", "status", "warning", "error"
    source TEXT,
    message TEXT NOT NULL
);
"""


STEP_COLS = "step, t_start, t_end, data_wait_s, samples, warmup, data_wait_runq_s, runq_s"
PHASE_COLS = "step, name, depth, t_start, t_end, dev_start, dev_end, runq_s"
# columns each schema version added: absent from an older store, they read as NULL
_ADDED = {"steps": ("data_wait_runq_s", "runq_s"), "phases": ("runq_s",)}


class StoreError(Exception):
    """The run store is missing, unreadable or not a stallscope store."""


class StoreBusy(StoreError):
    """The run store is locked by another process past :data:`READ_TIMEOUT_S` (a writer holding it exclusively)."""


class StoreWriteError(Exception):
    """The run store could not be written (disk full, over quota, the file size limit, the directory removed).

    ``last_kept`` is the last step the store holds (-1: none); everything committed before the failure is kept.
    """

    def __init__(self, message: str, path: Path, last_kept: int) -> None:
        super().__init__(message)
        self.path = path
        self.last_kept = last_kept


class RunDirBusy(Exception):
    """Another live process writes this run directory; ``pid`` is its process id (None: unknown)."""

    def __init__(self, run_dir: Path, pid: int | None) -> None:
        who = f"a live run (pid {pid})" if pid is not None else "another live run"
        super().__init__(f"'{run_dir}' is in use by {who}")
        self.run_dir = run_dir
        self.pid = pid


def make_dir(path: Path) -> None:
    """``mkdir -p`` with the umask respected, except that a directory it creates is never world-writable."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    path.mkdir(parents=True, exist_ok=True)
    for d in missing:
        no_world_write(d)


def no_world_write(path: Path) -> None:
    """Clear the world-write bit of a file or directory stallscope created (umask 000 would leave it set)."""
    with contextlib.suppress(OSError):
        mode = path.lstat().st_mode
        if mode & stat.S_IWOTH and not stat.S_ISLNK(mode):
            path.chmod(stat.S_IMODE(mode) & ~stat.S_IWOTH)


_LOCKS: dict[str, list[int]] = {}  # resolved run directory -> [lock fd, stores using it]
_LOCKS_GUARD = threading.Lock()
_CLI_CLAIMS: set[str] = set()  # directories the CLI holds until the process exits


def _lock_pid(lock: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(lock.read_text().split()[0])
    return None


def lock_run_dir(run_dir: Path, *, store: bool = False) -> bool:
    """Claim ``run_dir`` for this process (RunDirBusy when another live process holds it); True when this
    call took the lock. ``store``: a RunStore's claim, refused when another store of this process has it."""
    key = os.path.realpath(run_dir)
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is not None:
            if store and held[1]:
                raise RunDirBusy(run_dir, os.getpid())
            held[1] += store
            return False
        lock = Path(key) / LOCK_NAME
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)  # our own lock on this file is not held: closing releases nothing of ours
            if exc.errno in (errno.EACCES, errno.EAGAIN):
                raise RunDirBusy(run_dir, _lock_pid(lock)) from None
            raise
        no_world_write(lock)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _LOCKS[key] = [fd, int(store)]
        return True


def unlock_run_dir(run_dir: Path) -> None:
    """A RunStore's release of :func:`lock_run_dir`; the lock itself goes when no store of this process uses it
    (a CLI's claim, ``store=False``, lasts until the process exits)."""
    key = os.path.realpath(run_dir)
    with _LOCKS_GUARD:
        held = _LOCKS.get(key)
        if held is None:
            return
        held[1] = max(0, held[1] - 1)
        if held[1] == 0 and key not in _CLI_CLAIMS:
            os.close(held[0])
            del _LOCKS[key]


def claim_run_dir(run_dir: Path) -> None:
    """The CLI's claim on a run (sweep, tune) directory for the rest of the process: RunDirBusy naming the pid
    of the live run that holds it."""
    lock_run_dir(run_dir)
    _CLI_CLAIMS.add(os.path.realpath(run_dir))


# StepRow and PhaseRow are the two row types a long run has hundreds of thousands of, built on every load and
# at every close: slotted but not frozen (a frozen dataclass's __init__ sets each field through
# object.__setattr__, 3x slower: 200,000 phases in 0.39 s instead of 0.12 s), hashable as if frozen. Treat them
# as immutable: nothing assigns to a row's fields.
@dataclass(slots=True, unsafe_hash=True)
class StepRow:
    step: int
    t_start: float
    t_end: float
    data_wait_s: float
    samples: int | None
    warmup: bool
    data_wait_runq_s: float | None = None  # schema v2; None: not measured, or a v1 store
    runq_s: float | None = None


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see StepRow
class PhaseRow:
    step: int
    name: str
    depth: int
    t_start: float
    t_end: float
    dev_start: float | None = None
    dev_end: float | None = None
    runq_s: float | None = None  # schema v2; None: not measured, or a v1 store


def _add_columns(con: sqlite3.Connection) -> None:
    """Bring an older store in the same directory up to this schema (additive: new columns are NULL)."""
    for table, cols in _ADDED.items():
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        for col in cols:
            if col not in have:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {col} REAL")


def _connect(path: Path) -> sqlite3.Connection:
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
        meta: dict[str, Any] | None = None,
        on_error: Callable[[StoreWriteError], None] | None = None,
    ) -> None:
        """Create the schema and write ``meta`` before returning: a reader never sees a store without it.
        RunDirBusy when another live store writes ``run_dir``. ``on_error`` is called once, on the writer
        thread, when a write fails (see the module docstring)."""
        if not 0 < flush_s <= 1.0:
            raise ValueError(f"flush_s must be in (0, 1], got {flush_s}")
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / DB_NAME
        make_dir(self.run_dir)
        lock_run_dir(self.run_dir, store=True)
        try:
            self._con = _connect(self.path)
            with self._con:
                self._con.executescript(_SCHEMA)
                _add_columns(self._con)
                self._con.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                self._con.executemany(
                    "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                    [(k, json.dumps(v)) for k, v in (meta or {}).items()],
                )
            self._ino = self.path.stat().st_ino
        except BaseException:
            unlock_run_dir(self.run_dir)
            raise
        for name in (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm"):
            no_world_write(self.run_dir / name)
        self._flush_s = flush_s
        self._on_error = on_error
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._kept = -1  # the last step committed
        self._failure: StoreWriteError | None = None
        # Only the meta table is mirrored in memory (a few keys): the rows are read back from the store when the
        # record is asked for (at close), so stallscope's memory does not grow with the run's length.
        self._meta: dict[str, Any] = {"schema_version": SCHEMA_VERSION, **json.loads(json.dumps(meta or {}))}
        self._late_events: list[tuple[float, str, str | None, str]] = []  # put after the writer stopped
        self._final: RunRecord | None = None  # a stopped store's committed rows, read before its file closed
        self._error: BaseException | None = None
        self._dead = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stallscope-store", daemon=True)
        self._closed = False
        self._thread.start()

    # -- producer side (any thread) ------------------------------------------------------------
    def put_meta(self, **items: Any) -> None:
        encoded = [(k, json.dumps(v)) for k, v in items.items()]
        self._meta.update((k, json.loads(v)) for k, v in encoded)
        if not self._dead:
            self._q.put(("meta", encoded))

    def put_step(self, row: StepRow, phases: Sequence[PhaseRow] = ()) -> None:
        if not self._dead:
            self._q.put(("step", row, phases))

    def put_samples(self, rows: Iterable[tuple[float, str, str, float | None]]) -> None:
        batch = list(rows)
        if not self._dead:
            self._q.put(("samples", batch))

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
        )

    def _read_file(self) -> RunRecord:
        """The committed rows, through a read connection of our own (the writer's belongs to its thread)."""
        try:
            con = _open_read(self.path)
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
        unlock_run_dir(self.run_dir)

    # -- writer thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        # Wake on a timer, not per item: a wake-up per training step costs the step a context switch
        # (measurable on 2 cores next to torch's intra-op threads); one per flush interval does not.
        con = self._con
        stopping = False
        while not stopping:
            stopping = self._stop.wait(self._flush_s)
            items = []
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

    def _commit(self, con: sqlite3.Connection, items: list[Any]) -> None:
        kept = self._kept
        for item in items:
            self._apply(con, item)
            if item[0] == "step":
                kept = max(kept, item[1].step)
        con.execute("INSERT OR REPLACE INTO meta VALUES ('heartbeat', ?)", (json.dumps(time.time()),))
        con.commit()
        self._kept = kept

    def _retry(self, con: sqlite3.Connection, items: list[Any]) -> bool:
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
    def _apply(con: sqlite3.Connection, item: tuple[Any, ...]) -> None:
        kind = item[0]
        if kind == "step":
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
        if kind == "samples":
            con.executemany("INSERT INTO samples VALUES (?,?,?,?)", item[1])
            return
        if kind == "event":
            con.execute("INSERT INTO events VALUES (?,?,?,?)", item[1])
            return
        if kind == "meta":
            con.executemany("INSERT OR REPLACE INTO meta VALUES (?,?)", item[1])
            return
        raise AssertionError(f"unknown store item {kind!r}")


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


# -- reader side ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RunRecord:
    """Everything a run store holds, loaded into memory for the (pure) analysis."""

    meta: dict[str, Any]
    steps: list[StepRow]
    phases: list[PhaseRow]
    samples: list[tuple[float, str, str, float | None]]
    events: list[tuple[float, str, str | None, str]]
    stacks_text: str | None = None  # py-spy's collapsed stacks (RUN_DIR/pyspy.txt), when recorded


def _cols(con: sqlite3.Connection, table: str) -> str:
    """The select list for ``table`` in StepRow / PhaseRow field order; columns an older store lacks read NULL."""
    have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
    wanted = (STEP_COLS if table == "steps" else PHASE_COLS).split(", ")
    return ", ".join(c if c in have or c not in _ADDED[table] else f"NULL AS {c}" for c in wanted)


def _step(r: Sequence[Any]) -> StepRow:
    return StepRow(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7])


def resolve_db(run: str | os.PathLike[str]) -> Path:
    """``RUN_DIR`` or ``RUN_DIR/run.sqlite`` -> the database path, or StoreError saying what is wrong."""
    p = Path(run)
    db = p / DB_NAME if p.is_dir() else p
    if not db.exists():
        if p.is_dir():
            raise StoreError(f"run directory '{p}' holds no {DB_NAME}: pass a directory written by stallscope run")
        raise StoreError(f"run directory '{p}' does not exist")
    return db


def load_run(run: str | os.PathLike[str]) -> RunRecord:
    """Read a whole run store (read-only; safe while another process is still writing it)."""
    db = resolve_db(run)
    con = _open_read(db)
    try:
        meta = read_meta(con, db)
        rec = read_rows(con, meta)
    except sqlite3.DatabaseError as exc:
        raise _read_error(db, exc) from None
    finally:
        con.close()
    return RunRecord(rec.meta, rec.steps, rec.phases, rec.samples, rec.events, read_stacks(db.parent))


def read_rows(con: sqlite3.Connection, meta: dict[str, Any]) -> RunRecord:
    """Every row of an open store, ordered as the analysis expects, with ``meta`` (no stacks)."""
    steps = [  # unpacked inline, not through _step(): once per step of a long run
        StepRow(i, a, b, wait, n, bool(warm), wait_rq, rq)
        for i, a, b, wait, n, warm, wait_rq, rq in con.execute(f"SELECT {_cols(con, 'steps')} FROM steps ORDER BY step")
    ]
    # Sorted here, not by SQL: the rows are stored nearly in order, which Python's sort takes in one pass,
    # while ORDER BY step, t_start walks the step index row by row and sorts again (200,000 phases: 0.31 s
    # of CPU this way, 0.38 s that way).
    phases = list(starmap(PhaseRow, con.execute(f"SELECT {_cols(con, 'phases')} FROM phases")))
    phases.sort(key=attrgetter("step", "t_start"))
    samples = list(con.execute("SELECT t, source, metric, value FROM samples ORDER BY t"))
    events = list(con.execute("SELECT t, kind, source, message FROM events ORDER BY t"))
    return RunRecord(meta, steps, phases, samples, events)


def read_head(run: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """A store's meta table (checked as :func:`load_run` checks it) and its number of step rows, without
    loading the rows: enough to tell whether the run's ``summary.json`` is the store's own."""
    db = resolve_db(run)
    con = _open_read(db)
    try:
        return read_meta(con, db), int(con.execute("SELECT count(*) FROM steps").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise _read_error(db, exc) from None
    finally:
        con.close()


def _open_read(db: Path) -> sqlite3.Connection:
    try:
        if not os.access(db, os.R_OK):
            raise StoreError(f"'{db}' is not readable (permission denied)")
        # Read-write open (nothing is written): after a SIGKILL it lets SQLite replay the WAL. A
        # read-only file system falls back to mode=ro, which reads the WAL when its -shm exists.
        return (
            sqlite3.connect(db, timeout=READ_TIMEOUT_S)
            if os.access(db.parent, os.W_OK)
            else sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=READ_TIMEOUT_S)
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open '{db}': {exc}") from None


def _read_error(db: Path, exc: sqlite3.DatabaseError) -> StoreError:
    """A reader's SQLite error as one line naming the file and what is wrong with it."""
    name = getattr(exc, "sqlite_errorname", "")
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return StoreBusy(
            f"'{db}' is locked by another process (a writer holding it exclusively for over "
            f"{READ_TIMEOUT_S:g} s): try again when it is done"
        )
    if name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB")) or "malformed" in str(exc):
        return StoreError(f"'{db}' is corrupt or truncated ({exc}): not a readable stallscope run store")
    return StoreError(f"'{db}' is not a readable stallscope run store: {exc}")


def read_meta(con: sqlite3.Connection, db: Path) -> dict[str, Any]:
    """The meta table, checked: StoreError when it is not a stallscope store's, or one of a newer schema."""
    try:
        meta = {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta")}
    except json.JSONDecodeError as exc:
        raise StoreError(f"'{db}' has a corrupt meta table: {exc}") from None
    version = meta.get("schema_version")
    if version is None:
        raise StoreError(f"'{db}' is not a stallscope run store (no schema_version)")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise StoreError(f"'{db}' has a corrupt meta table: schema_version {version!r} is not a version number")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"'{db}' was written by a newer stallscope (store schema {version}; this one reads up to "
            f"{SCHEMA_VERSION}): upgrade stallscope to read it"
        )
    if meta.get("status") == "running":  # its writer stopped with no room left in the store to say so
        with contextlib.suppress(OSError, UnicodeDecodeError):
            meta.update(status="failed", error=(db.parent / ERROR_NAME).read_text().strip())
    return meta


def read_stacks(run_dir: Path) -> str | None:
    """py-spy's output beside the store, when one was recorded."""
    return next((f.read_text(errors="replace") for f in (run_dir / n for n in STACKS_NAMES) if f.exists()), None)


def integrity_ok(run: str | os.PathLike[str]) -> bool:
    """``PRAGMA integrity_check`` on the run store."""
    con = sqlite3.connect(resolve_db(run))
    try:
        return bool(con.execute("PRAGMA integrity_check").fetchone()[0] == "ok")
    finally:
        con.close()


class StoreTail:
    """Incremental reader of a run store another process may still be writing (``stallscope watch``).

    Each ``poll()`` returns only rows newer than the previous poll: steps by index, samples by time.
    """

    def __init__(self, run: str | os.PathLike[str]) -> None:
        self.db = resolve_db(run)
        self._last_step = -1
        self._last_t = -1.0

    def poll(self) -> tuple[dict[str, Any], list[tuple[StepRow, list[PhaseRow]]], list[tuple[float, dict[str, float]]]]:
        con = _open_read(self.db)
        try:
            meta = read_meta(con, self.db)
            rows = con.execute(
                f"SELECT {_cols(con, 'steps')} FROM steps WHERE step > ? ORDER BY step", (self._last_step,)
            ).fetchall()
            phases: dict[int, list[PhaseRow]] = {}
            for r in con.execute(
                f"SELECT {_cols(con, 'phases')} FROM phases WHERE step > ? ORDER BY step, t_start", (self._last_step,)
            ):
                phases.setdefault(r[0], []).append(PhaseRow(*r))
            grouped: dict[float, dict[str, float]] = {}
            for t, metric, value in con.execute(
                "SELECT t, metric, value FROM samples WHERE t > ? AND source != 'sampler' ORDER BY t", (self._last_t,)
            ):
                grouped.setdefault(t, {})[metric] = math.nan if value is None else value
        except sqlite3.DatabaseError as exc:
            raise _read_error(self.db, exc) from None
        finally:
            con.close()
        steps = [(_step(r), phases.get(r[0], [])) for r in rows]
        if steps:
            self._last_step = steps[-1][0].step
        if grouped:
            self._last_t = max(grouped)
        return meta, steps, sorted(grouped.items())


def run_status(meta: dict[str, Any], now: float | None = None) -> str:
    """A store's status: the stored one, except that a run still marked ``running`` whose writer is gone
    (its pid has exited, or its heartbeat is older than STALE_HEARTBEAT_S) was interrupted."""
    status = str(meta.get("status", "interrupted"))
    if status != "running":
        return status
    now = time.time() if now is None else now
    heartbeat = float(meta.get("heartbeat") or meta.get("started_at") or 0.0)
    pid = meta.get("pid")
    if now - heartbeat > STALE_HEARTBEAT_S or not (isinstance(pid, int) and pid_alive(pid)):
        return "interrupted"
    return "running"


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (a writer's liveness, a target to attach to)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True
