"""A stored run read back once: its record and Summary, or its own ``summary.json`` when that is current; a long
run's store read in bulk (:func:`load_bulk`), which writes its report cache where the run has none and will not
change again (a run that was killed or interrupted: docs/store.md, "The report cache").

Raises :class:`~profiler.core.store.StoreError` (one line naming the store and what is wrong) for a directory
that is not a readable run store; the CLI turns it into exit 2.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.analysis import Summary, summarize
from profiler.core.rows import RunRecord
from profiler.core.store import load_run, load_sparse, read_head, resolve_db, run_status
from profiler.core.store.reader import StepSpan

if TYPE_CHECKING:
    from profiler.analysis.timeline import Timeline
    from profiler.core.store.columns import RunColumns


def load(run_dir: str | Path) -> tuple[RunRecord, Summary]:
    """(the run's record, its Summary), read once."""
    rec = load_run(run_dir)
    return rec, summarize(rec)


@dataclass(frozen=True, slots=True)
class ForTrace:
    """What a run's trace reads of its store: the record of the steps drawn in full (with their phases, and every
    sample, event and window), each run of steps between them summarised in SQL, and the number of steps."""

    record: RunRecord
    summarised: list[StepSpan]
    steps: int


def load_for_trace(run_dir: str | Path) -> ForTrace:
    """The run's rows its trace draws (``render.trace.trace_plan``): a 100,000-step run's trace reads 10,000 steps
    and their phases as rows, and of the 90,000 others 19 summaries made in SQL."""
    from profiler.render.trace import trace_plan

    return ForTrace(*load_sparse(run_dir, trace_plan))


@dataclass(frozen=True, slots=True)
class Bulk:
    """A store read in bulk: its columns, its Summary, and its Timeline (None where neither asked for nor written to
    the cache); ``cached``: the report cache was written."""

    columns: RunColumns
    summary: Summary
    timeline: Timeline | None
    cached: bool


def load_bulk(run_dir: str | Path, *, timeline: bool = False) -> Bulk:
    """The run's Summary from its store read in bulk (:mod:`profiler.analysis.bulk`: the same as from its rows),
    and its Timeline where ``timeline`` asks. Where the store will not change again (:func:`cache.settled`), its
    report cache is written too, so that the next ``report`` reads that instead (a directory that takes no file:
    not written)."""
    from profiler.analysis.bulk import summarize_columns
    from profiler.analysis.timeline import timeline_of_columns
    from profiler.core.store.columns import load_columns
    from profiler.runs.cache import settled, store_cache

    cols = load_columns(run_dir)
    summary = summarize_columns(cols)
    settle = settled(cols.meta)
    plots = timeline_of_columns(cols) if timeline or settle else None
    cached = False
    if settle and plots is not None:
        # a read-only or full directory: the next report reads the rows again
        with contextlib.suppress(OSError):
            cached = store_cache(run_dir, summary, plots, read=(cols.meta, len(cols.steps))) is not None
    return Bulk(cols, summary, plots, cached)


def cache_orphaned(run_dir: str) -> None:
    """The report cache of a run whose training process is gone (killed), written by its sampler process once it
    has closed the store (``interrupted``): :func:`load_bulk`, which writes it, so that the user's first ``report``
    reads the cache rather than every row. A store that is not settled yet, or a directory that takes no file: no
    cache (the report reads the rows)."""
    load_bulk(run_dir)


def trace_of_columns(run_dir: str | Path, cols: RunColumns) -> ForTrace:
    """:func:`load_for_trace` of a store already read in bulk: the same rows, from the columns."""
    from profiler.core.store.columns import load_sparse_of
    from profiler.render.trace import trace_plan

    return ForTrace(*load_sparse_of(run_dir, cols, trace_plan))


def stored_summary(run_dir: str | Path) -> dict[str, object] | None:
    """``RUN_DIR/summary.json`` when it is the store's own summary, written at close: the store's status is
    final (not running, not interrupted) and the same as the summary's, the run id and the number of steps
    match, and the file is not older than the store. Else None: the store is summarised again (a long run's
    store takes seconds to load, its summary.json milliseconds)."""
    meta, n_steps = read_head(run_dir)
    db = resolve_db(run_dir)
    path = db.parent / "summary.json"
    try:
        fresh = path.is_file() and path.stat().st_mtime >= db.stat().st_mtime
        doc = json.loads(path.read_text()) if fresh else None
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    status = meta.get("status")
    if not isinstance(doc, dict) or status in (None, "running", "interrupted") or run_status(meta) != status:
        return None
    measured, warmup = doc.get("steps"), doc.get("warmup_steps")
    if doc.get("status") != status or doc.get("run_id") != meta.get("run_id"):
        return None
    return doc if type(measured) is int and type(warmup) is int and measured + warmup == n_steps else None
