"""A closed run's Summary, built from its rows and written beside them (``summary.json``, and the report cache that
``report`` reads instead of the rows): what the recorders of :mod:`profiler.core` call at close, passed in by the
layers above them (the core imports no analysis)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from profiler.core.store import no_world_write

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.rows import RunRecord

log = logging.getLogger("stallscope")


def summarize_run(
    record: Callable[[], RunRecord], out_dir: Path, write: bool, warn: Callable[[str], None]
) -> Summary | None:
    """The run's Summary from its rows, written to ``out_dir/summary.json`` when ``write`` (not for a store that
    stopped writing: it holds less than the summary would claim, and `report` rebuilds it); None, logged, when it
    could not be built."""
    from profiler.analysis import summarize

    try:
        rec = record()
        summary = summarize(rec)
    # the store is the record: a summary that fails (any bug in analysis) must not hide the run's outcome
    except Exception as exc:  # noqa: BLE001
        log.error("stallscope: could not build the summary: %s", exc)
        return None
    if write:
        path = out_dir / "summary.json"
        try:
            path.write_text(json.dumps(summary.to_dict(), indent=2) + "\n")
            no_world_write(path)
        except OSError as exc:  # a read-only or full directory: the store still holds the run
            warn(f"could not write {path}: {exc.strerror or exc}; the run store holds the run")
        else:
            _write_report_cache(out_dir, rec, summary)
    return summary


def _write_report_cache(out_dir: Path, rec: RunRecord, summary: Summary) -> None:
    """What ``report`` reads of a closed run instead of its rows (profiler.runs.cache); without it, the rows."""
    from profiler.runs.cache import write_cache

    try:
        write_cache(out_dir, rec, summary)
    except OSError:  # summary.json was written: the directory took that, and `report` reads the rows instead
        pass
    except Exception as exc:  # noqa: BLE001 - a bug in the timeline must not hide the run's outcome
        log.error("stallscope: could not write the report cache: %s", exc)
