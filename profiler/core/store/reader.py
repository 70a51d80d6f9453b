"""The reader side of ``run.sqlite``: a whole run (:func:`load_run`), its head, or its newest rows
(:class:`StoreTail`); safe while another process still writes it, and after any crash."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from itertools import starmap
from operator import attrgetter
from pathlib import Path

from profiler.core.rows import KernelWindow, PhaseRow, RunRecord, StepRow
from profiler.core.store.lock import pid_alive
from profiler.core.store.schema import (
    DB_NAME,
    ERROR_NAME,
    READ_TIMEOUT_S,
    SCHEMA_VERSION,
    STACKS_NAMES,
    STALE_HEARTBEAT_S,
    StoreBusy,
    StoreError,
    select_cols,
)

Meta = dict[str, object]  # the meta table: each key's JSON value


def _step(r: tuple[int, float, float, float, int | None, int, float | None, float | None]) -> StepRow:
    return StepRow(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7])


def resolve_db(run: str | os.PathLike[str]) -> Path:
    """``RUN_DIR`` or ``RUN_DIR/run.sqlite`` -> the database path, or StoreError saying what is wrong."""
    p = Path(run)
    db = p / DB_NAME if p.is_dir() else p
    if not db.exists():
        if p.is_dir():
            raise StoreError(f"run directory '{p}' holds no {DB_NAME}: pass a directory written by stallscope run")
        raise StoreError(f"run directory '{p}' does not exist")
    if db is p and p.name != DB_NAME and not _sqlite_header(p):
        # a file that is no database at all (a saved report, a log) is not a damaged run: say what is expected
        raise StoreError(
            f"'{p}' is not a stallscope run: expected a run directory holding {DB_NAME}, or a {DB_NAME} file"
        )
    return db


def _sqlite_header(path: Path) -> bool:
    """The file starts as every SQLite database does (True where it cannot be read: the reader says why)."""
    try:
        with path.open("rb") as f:
            return f.read(16) == b"SQLite format 3\x00"
    except OSError:
        return True


def load_run(run: str | os.PathLike[str], *, phases_of: PhaseRanges | None = None) -> RunRecord:
    """Read a whole run store (read-only; safe while another process is still writing it). ``phases_of``: the
    phases of only the steps it names (ranges of step numbers, both ends included, from the steps read)."""
    db = resolve_db(run)
    con = open_read(db)
    try:
        con.execute("BEGIN")  # one snapshot for every query of a store being written (as load_columns)
        meta = read_meta(con, db)
        rec = read_rows(con, meta, phases_of=phases_of)
    except sqlite3.DatabaseError as exc:
        raise read_error(db, exc) from None
    finally:
        con.close()
    return RunRecord(rec.meta, rec.steps, rec.phases, rec.samples, rec.events, read_stacks(db.parent), rec.windows)


PhaseRanges = Callable[[list[StepRow]], Sequence[tuple[int, int]]]
# step numbers -> (ranges read as rows, ranges summarised): both ends included
StepPlan = Callable[[Sequence[int]], tuple[Sequence[tuple[int, int]], Sequence[tuple[int, int]]]]


@dataclass(frozen=True, slots=True)
class StepSpan:
    """A range of steps summarised in SQL: how many, the first and last step numbers, and over those whose times
    are finite (``timed``) the earliest start, the latest end and the sums of their step times and data waits (s;
    SQLite's sums, not compensated)."""

    steps: int
    first: int
    last: int
    timed: int
    t_start: float | None
    t_end: float | None
    step_s: float | None
    data_wait_s: float | None


class _Numbers(Sequence[int]):
    """A run's step numbers in order, read only where asked: ``MIN(step) + i`` where the steps are contiguous (every
    run a Session records), else from the rows."""

    def __init__(self, con: sqlite3.Connection) -> None:
        n, lo, hi = con.execute("SELECT COUNT(*), MIN(step), MAX(step) FROM steps").fetchone()
        self._n, self._lo = int(n), int(lo or 0)
        self._all = (
            None if n == 0 or hi - lo + 1 == n else [k for (k,) in con.execute("SELECT step FROM steps ORDER BY step")]
        )

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._all[i] if self._all is not None else self._lo + i


# the finite test made once a row (LIMIT -1 keeps SQLite from folding it into each aggregate); ``x * f`` is x where
# the row's times are finite (f = 1) and NULL where not, as the four CASEs before this gave it
_SPAN = (
    "SELECT COUNT(*), MIN(step), MAX(step), COUNT(f), MIN(t_start * f), MAX(t_end * f), SUM((t_end - t_start) * f), "
    "SUM(data_wait_s * f) FROM (SELECT step, t_start, t_end, data_wait_s, "
    "CASE WHEN abs(t_start) + abs(t_end) + abs(data_wait_s) < 1e308 THEN 1 END AS f "
    "FROM steps WHERE step BETWEEN ? AND ? LIMIT -1)"
)


def load_sparse(run: str | os.PathLike[str], plan: StepPlan) -> tuple[RunRecord, list[StepSpan], int]:
    """A long run read as its trace draws it: ``plan`` takes the run's step numbers and names the ranges whose
    steps and phases are read as rows (the record's, with every sample, event and window) and those summarised in
    SQL (:class:`StepSpan`). Returns the record, the summaries and the number of steps stored."""
    db = resolve_db(run)
    con = open_read(db)
    try:
        meta = read_meta(con, db)
        numbers = _Numbers(con)
        rows, summarised = plan(numbers)
        steps: list[StepRow] = []
        phases: list[PhaseRow] = []
        query = f"SELECT {select_cols(con, 'phases')} FROM phases WHERE step BETWEEN ? AND ?"
        step_query = f"SELECT {select_cols(con, 'steps')} FROM steps WHERE step BETWEEN ? AND ? ORDER BY step"
        for first, last in rows:
            steps.extend(_step(r) for r in con.execute(step_query, (first, last)))
            phases.extend(starmap(PhaseRow, con.execute(query, (first, last))))
        phases.sort(key=attrgetter("step", "t_start"))
        spans = step_spans(con, summarised)
        samples = list(con.execute("SELECT t, source, metric, value FROM samples ORDER BY t"))
        events = list(con.execute("SELECT t, kind, source, message FROM events ORDER BY t"))
        windows = read_windows(con)
    except sqlite3.DatabaseError as exc:
        raise read_error(db, exc) from None
    finally:
        con.close()
    rec = RunRecord(meta, steps, phases, samples, events, read_stacks(db.parent), windows)
    return rec, spans, len(numbers)


def step_spans(con: sqlite3.Connection, ranges: Sequence[tuple[int, int]]) -> list[StepSpan]:
    """Each range of steps (both ends included) summarised in SQL (:class:`StepSpan`)."""
    return [StepSpan(*con.execute(_SPAN, r).fetchone()) for r in ranges]


def read_rows(con: sqlite3.Connection, meta: Meta, *, phases_of: PhaseRanges | None = None) -> RunRecord:
    """Every row of an open store, ordered as the analysis expects, with ``meta`` (no stacks); ``phases_of`` as
    :func:`load_run`'s."""
    steps = [  # unpacked inline, not through _step(): once per step of a long run
        StepRow(i, a, b, wait, n, bool(warm), wait_rq, rq)
        for i, a, b, wait, n, warm, wait_rq, rq in con.execute(
            f"SELECT {select_cols(con, 'steps')} FROM steps ORDER BY step"
        )
    ]
    # Sorted here, not by SQL: the rows are stored nearly in order, which Python's sort takes in one pass,
    # while ORDER BY step, t_start walks the step index row by row and sorts again (200,000 phases: 0.31 s
    # of CPU this way, 0.38 s that way).
    query = f"SELECT {select_cols(con, 'phases')} FROM phases"
    if phases_of is None:
        phases = list(starmap(PhaseRow, con.execute(query)))
    else:
        phases = []
        for first, last in phases_of(steps):
            phases.extend(starmap(PhaseRow, con.execute(f"{query} WHERE step BETWEEN ? AND ?", (first, last))))
    phases.sort(key=attrgetter("step", "t_start"))
    samples = list(con.execute("SELECT t, source, metric, value FROM samples ORDER BY t"))
    events = list(con.execute("SELECT t, kind, source, message FROM events ORDER BY t"))
    return RunRecord(meta, steps, phases, samples, events, None, read_windows(con))


def read_windows(con: sqlite3.Connection) -> tuple[KernelWindow, ...]:
    """The kernel windows and their activities (none in a store older than schema 3)."""
    if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'kernel_windows'").fetchone() is None:
        return ()
    acts: dict[int, list[tuple[int, int, float, float, float]]] = {}
    for w, stream, kind, a, b, c in con.execute("SELECT * FROM kernels ORDER BY window, t_start"):
        acts.setdefault(w, []).append((stream, kind, a, b, math.nan if c is None else c))
    return tuple(
        KernelWindow(w, a, b, cost, acts.get(w, []), math.nan if rec is None else rec)
        for w, a, b, cost, rec in con.execute(f"SELECT {select_cols(con, 'kernel_windows')} FROM kernel_windows "
                                              "ORDER BY window")
    )  # fmt: skip


def read_head(run: str | os.PathLike[str]) -> tuple[Meta, int]:
    """A store's meta table (checked as :func:`load_run` checks it) and its number of step rows, without
    loading the rows: enough to tell whether the run's ``summary.json`` is the store's own."""
    db = resolve_db(run)
    con = open_read(db)
    try:
        return read_meta(con, db), int(con.execute("SELECT count(*) FROM steps").fetchone()[0])
    except sqlite3.DatabaseError as exc:
        raise read_error(db, exc) from None
    finally:
        con.close()


def open_read(db: Path) -> sqlite3.Connection:
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


def read_error(db: Path, exc: sqlite3.DatabaseError) -> StoreError:
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


def read_meta(con: sqlite3.Connection, db: Path) -> Meta:
    """The meta table, checked: StoreError when it is not a stallscope store's, or one of a newer schema."""
    try:
        meta: Meta = {k: json.loads(v) for k, v in con.execute("SELECT key, value FROM meta")}
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
        self._windows = 0  # kernel windows read so far

    def new_windows(self) -> list[KernelWindow]:
        """The kernel windows stored since the last call (their activities read only when one came)."""
        con = open_read(self.db)
        try:
            if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'kernel_windows'").fetchone() is None:
                return []
            (n,) = con.execute("SELECT COUNT(*) FROM kernel_windows").fetchone()
            if n <= self._windows:
                return []
            windows = read_windows(con)
        except sqlite3.DatabaseError as exc:
            raise read_error(self.db, exc) from None
        finally:
            con.close()
        self._windows = len(windows)
        return list(windows)

    def poll(self) -> tuple[Meta, list[tuple[StepRow, list[PhaseRow]]], list[tuple[float, dict[str, float]]]]:
        con = open_read(self.db)
        try:
            meta = read_meta(con, self.db)
            rows = con.execute(
                f"SELECT {select_cols(con, 'steps')} FROM steps WHERE step > ? ORDER BY step", (self._last_step,)
            ).fetchall()
            phases: dict[int, list[PhaseRow]] = {}
            for r in con.execute(
                f"SELECT {select_cols(con, 'phases')} FROM phases WHERE step > ? ORDER BY step, t_start",
                (self._last_step,),
            ):
                phases.setdefault(r[0], []).append(PhaseRow(*r))
            grouped: dict[float, dict[str, float]] = {}
            for t, metric, value in con.execute(
                "SELECT t, metric, value FROM samples WHERE t > ? AND source != 'sampler' ORDER BY t", (self._last_t,)
            ):
                grouped.setdefault(t, {})[metric] = math.nan if value is None else value
        except sqlite3.DatabaseError as exc:
            raise read_error(self.db, exc) from None
        finally:
            con.close()
        steps = [(_step(r), phases.get(r[0], [])) for r in rows]
        if steps:
            self._last_step = steps[-1][0].step
        if grouped:
            self._last_t = max(grouped)
        return meta, steps, sorted(grouped.items())


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_status(meta: Mapping[str, object], now: float | None = None) -> str:
    """A store's status: the stored one, except that a run still marked ``running`` whose writer is gone
    (its pid has exited, or its heartbeat is older than STALE_HEARTBEAT_S) was interrupted."""
    status = str(meta.get("status", "interrupted"))
    if status != "running":
        return status
    now = time.time() if now is None else now
    heartbeat = _number(meta.get("heartbeat")) or _number(meta.get("started_at")) or 0.0
    pid = meta.get("pid")
    if now - heartbeat > STALE_HEARTBEAT_S or not (isinstance(pid, int) and pid_alive(pid)):
        return "interrupted"
    return "running"
