"""A stored run read back once: its record and Summary, or its own ``summary.json`` when that is current.

Raises :class:`~profiler.core.store.StoreError` (one line naming the store and what is wrong) for a directory
that is not a readable run store; the CLI turns it into exit 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from profiler.analysis import Summary, summarize
from profiler.core.rows import RunRecord
from profiler.core.store import load_run, load_sparse, read_head, resolve_db, run_status
from profiler.core.store.reader import StepSpan


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
