"""A run store read in bulk: its steps and phases as numpy columns, one query each and no Python object per row,
for the commands that read a long run back (``report``, ``compare``; docs/store.md, "Reading a long run").

A 100,000-step store holds 300,000 step and phase rows; as :class:`StepRow` and :class:`PhaseRow` objects they
took 0.5 s to read and most of the analysis's time after. Read here, the same rows are arrays, and
:meth:`RunColumns.record` makes the objects only where an analysis still needs them.

Invariants:
- The columns hold exactly what :func:`~profiler.core.store.reader.load_run` reads, in its order (steps by
  step; phases by step, then start, ties in storage order), and :meth:`RunColumns.record` gives its RunRecord.
- A NULL is NaN in a float column (SQLite stores no NaN, so a NaN read back was a NULL) and -1 in ``items`` (a
  batch's item count, never negative).
"""

from __future__ import annotations

import math
import os
import sqlite3
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from profiler.core.rows import KernelWindow, PhaseRow, RunRecord, StepRow
from profiler.core.store.reader import (
    StepPlan,
    StepSpan,
    open_read,
    read_error,
    read_meta,
    read_stacks,
    read_windows,
    resolve_db,
    step_spans,
)
from profiler.core.store.schema import select_cols

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    Floats = NDArray[np.float64]
    Ints = NDArray[np.int64]

# a NULL read as this (-inf): no stored time or wait is -inf, and -inf then becomes NaN
_NULL = "-9e999"


@dataclass(frozen=True, slots=True)
class StepColumns:
    """The steps table, in step order (StepRow's fields; ``items`` is its ``samples``, -1 where unknown)."""

    step: Ints
    t_start: Floats
    t_end: Floats
    data_wait_s: Floats
    items: Ints
    warmup: NDArray[np.bool_]
    data_wait_runq_s: Floats
    runq_s: Floats

    def __len__(self) -> int:
        return len(self.step)

    def rows(self, at: NDArray[np.int64] | None = None) -> list[StepRow]:
        """The StepRows :func:`load_run` reads (those at the indices ``at``, in their order, when given)."""
        if at is not None:
            return StepColumns(
                self.step[at],
                self.t_start[at],
                self.t_end[at],
                self.data_wait_s[at],
                self.items[at],
                self.warmup[at],
                self.data_wait_runq_s[at],
                self.runq_s[at],
            ).rows()
        items = self.items.tolist()
        if (self.items < 0).any():
            items = [None if n < 0 else n for n in items]
        return list(
            map(
                StepRow,
                self.step.tolist(),
                self.t_start.tolist(),
                self.t_end.tolist(),
                self.data_wait_s.tolist(),
                items,
                self.warmup.tolist(),
                _optional(self.data_wait_runq_s),
                _optional(self.runq_s),
            )
        )


@dataclass(frozen=True, slots=True)
class PhaseColumns:
    """The phases table sorted as :func:`load_run` sorts it; ``name`` is an index into ``names``."""

    step: Ints
    name: Ints
    names: tuple[str, ...]
    depth: Ints
    t_start: Floats
    t_end: Floats
    dev_start: Floats
    dev_end: Floats
    runq_s: Floats

    def __len__(self) -> int:
        return len(self.step)

    def rows(self, keep: NDArray[np.bool_] | None = None) -> list[PhaseRow]:
        """The PhaseRows :func:`load_run` reads (only those ``keep`` marks, when given)."""
        cols = (self.step, self.name, self.depth, self.t_start, self.t_end, self.dev_start, self.dev_end, self.runq_s)
        if keep is not None:
            cols = tuple(c[keep] for c in cols)  # type: ignore[assignment]
        step, name, depth, a, b, da, db, rq = (c.tolist() for c in cols)
        names = self.names
        return [
            PhaseRow(step[k], names[name[k]], depth[k], a[k], b[k], _none(da[k]), _none(db[k]), _none(rq[k]))
            for k in range(len(step))
        ]


@dataclass(frozen=True, slots=True)
class RunColumns:
    """A whole run store: meta, steps and phases as columns, and the (few) samples, events and windows as
    :class:`RunRecord` holds them."""

    meta: dict[str, Any]
    steps: StepColumns
    phases: PhaseColumns
    samples: list[tuple[float, str, str, float | None]]
    events: list[tuple[float, str, str | None, str]]
    stacks_text: str | None
    windows: tuple[KernelWindow, ...]

    def record(self, *, steps: bool = True, phases: bool = True) -> RunRecord:
        """The run's RunRecord, as :func:`load_run` reads it; without its steps or phases where not wanted."""
        return RunRecord(
            self.meta,
            self.steps.rows() if steps else [],
            self.phases.rows() if phases else [],
            self.samples,
            self.events,
            self.stacks_text,
            self.windows,
        )


def load_sparse_of(
    run: str | os.PathLike[str], cols: RunColumns, plan: StepPlan
) -> tuple[RunRecord, list[StepSpan], int]:
    """:func:`~profiler.core.store.reader.load_sparse` of a store already read as ``cols``: the same record, its
    rows taken from the columns, and the same summaries, made by the same SQL."""
    import numpy as np

    numbers = cols.steps.step
    rows, summarised = plan(numbers.tolist())
    ph = cols.phases
    step_at = [np.flatnonzero((numbers >= a) & (numbers <= b)) for a, b in rows]
    phase_at = [np.flatnonzero((ph.step >= a) & (ph.step <= b)) for a, b in rows]
    take = np.concatenate(phase_at) if phase_at else np.zeros(0, np.int64)
    # as load_sparse: the ranges' phases, then sorted by step and start (a stable sort)
    order = np.argsort(ph.t_start[take], kind="stable")
    take = take[order[np.argsort(ph.step[take][order], kind="stable")]]
    keep = np.zeros(len(ph), bool)
    keep[take] = True
    phases = ph.rows(keep) if len(np.unique(take)) == len(take) and np.all(np.diff(take) > 0) else _rows_at(ph, take)
    steps = cols.steps.rows(np.concatenate(step_at)) if step_at else []
    db = resolve_db(run)
    con = open_read(db)
    try:
        spans = step_spans(con, summarised)
    except sqlite3.DatabaseError as exc:
        raise read_error(db, exc) from None
    finally:
        con.close()
    rec = RunRecord(cols.meta, steps, phases, cols.samples, cols.events, cols.stacks_text, cols.windows)
    return rec, spans, len(numbers)


def _rows_at(ph: PhaseColumns, at: NDArray[np.int64]) -> list[PhaseRow]:
    return PhaseColumns(
        ph.step[at],
        ph.name[at],
        ph.names,
        ph.depth[at],
        ph.t_start[at],
        ph.t_end[at],
        ph.dev_start[at],
        ph.dev_end[at],
        ph.runq_s[at],
    ).rows()


def _optional(x: Floats) -> list[float | None]:
    """A float column as the rows hold it: None where NULL (NaN here); most are NULL but on a few steps."""
    import numpy as np

    out: list[float | None] = [None] * len(x)
    at = np.flatnonzero(~np.isnan(x))
    for k, v in zip(at.tolist(), x[at].tolist(), strict=True):
        out[k] = v
    return out


def _none(x: float) -> float | None:
    return None if math.isnan(x) else x  # NaN: the column was NULL


def load_columns(run: str | os.PathLike[str]) -> RunColumns:
    """Read a whole run store as columns (read-only; safe while another process writes it, as load_run)."""
    db = resolve_db(run)
    con = open_read(db)
    try:
        # one read transaction: every query below sees the same snapshot of a store another process is writing
        # (WAL). Without it a phase committed between two queries was in the second and not the first (an
        # IndexError on a live run's report, a fresh-clone CI beside two busy processes)
        con.execute("BEGIN")
        meta = read_meta(con, db)
        steps = _steps(con)
        phases = _phases(con)
        samples = list(con.execute("SELECT t, source, metric, value FROM samples ORDER BY t"))
        events = list(con.execute("SELECT t, kind, source, message FROM events ORDER BY t"))
        windows = read_windows(con)
    except sqlite3.DatabaseError as exc:
        raise read_error(db, exc) from None
    finally:
        con.close()
    return RunColumns(meta, steps, phases, samples, events, read_stacks(db.parent), windows)


def _steps(con: sqlite3.Connection) -> StepColumns:
    import numpy as np

    i, a, b, w, n, warm, wq, rq = _cols(con, "steps")
    dtype = [("i", "i8"), ("a", "f8"), ("b", "f8"), ("w", "f8"), ("n", "i8"), ("h", "i8")]
    query = f"SELECT {i}, {a}, {b}, {w}, IFNULL({n}, -1), {warm} FROM steps ORDER BY step"
    rows = np.fromiter(con.execute(query), dtype)
    waits, runq = np.full(len(rows), np.nan), np.full(len(rows), np.nan)
    # the run-queue waits: NULL but on the steps timed (one in k), read apart
    timed = np.fromiter(
        con.execute(
            f"SELECT {i}, IFNULL({wq}, {_NULL}), IFNULL({rq}, {_NULL}) FROM steps "
            f"WHERE {wq} IS NOT NULL OR {rq} IS NOT NULL"
        ),
        [("i", "i8"), ("wq", "f8"), ("rq", "f8")],
    )
    if len(timed):
        at = np.searchsorted(rows["i"], timed["i"])
        waits[at], runq[at] = _nulls(timed["wq"]), _nulls(timed["rq"])
    return StepColumns(rows["i"], rows["a"], rows["b"], rows["w"], rows["n"], rows["h"] != 0, waits, runq)


def _phases(con: sqlite3.Connection) -> PhaseColumns:
    import numpy as np

    names = tuple(n for (n,) in con.execute("SELECT DISTINCT name FROM phases"))
    i, _name, depth, a, b, da, db, rq = _cols(con, "phases")
    # one query in storage order, each name's index made in SQL (not a string per row); the depth, nonzero only
    # on nested phases, read apart with the columns that are NULL on most rows
    code = f"CASE name {' '.join(f'WHEN ? THEN {k}' for k in range(len(names)))} END" if names else "0"
    query = f"SELECT rowid, {i}, {code}, {a}, {b} FROM phases ORDER BY rowid"
    dtype = [("r", "i8"), ("i", "i8"), ("c", "i8"), ("a", "f8"), ("b", "f8")]
    rows = np.fromiter(con.execute(query, names), dtype)
    # as load_run: by step, then start, ties in storage order (lexsort is stable)
    rows = rows[np.lexsort((rows["a"], rows["i"]))]
    extra = [np.full(len(rows), np.nan) for _ in range(3)]  # dev_start, dev_end, runq_s: NULL on a CPU's steps
    depths = np.zeros(len(rows), np.int64)
    more = np.fromiter(
        con.execute(
            f"SELECT rowid, {depth}, IFNULL({da}, {_NULL}), IFNULL({db}, {_NULL}), IFNULL({rq}, {_NULL}) FROM phases "
            f"WHERE {depth} != 0 OR {da} IS NOT NULL OR {db} IS NOT NULL OR {rq} IS NOT NULL"
        ),
        [("r", "i8"), ("d", "i8"), ("da", "f8"), ("db", "f8"), ("rq", "f8")],
    )
    if len(more):
        by_rowid = np.argsort(rows["r"])
        at = by_rowid[np.searchsorted(rows["r"], more["r"], sorter=by_rowid)]
        depths[at] = more["d"]
        for col, key in zip(extra, ("da", "db", "rq"), strict=True):
            col[at] = _nulls(more[key])
    return PhaseColumns(rows["i"], rows["c"], names, depths, rows["a"], rows["b"], *extra)


def _nulls(x: Floats) -> Floats:
    import numpy as np

    return np.where(np.isneginf(x), np.nan, x)


def _cols(con: sqlite3.Connection, table: str) -> list[str]:
    """The table's columns in row order; NULL for one an older store lacks."""
    return [c.split(" AS ")[0] for c in select_cols(con, table).split(", ")]
