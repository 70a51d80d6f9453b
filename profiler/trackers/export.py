"""``stallscope report RUN --to TARGET``: a stored run's records written to a tracker after the run.

It reads the store alone (``profiler.runs.read``, ``profiler.jobs.jobdir``), so a killed run exports too. It
writes the step series (the held steps apart, under ``stall/held/``), the summary figures, the verdict and
recommendations as text, and the HTML report as an artifact where the tracker keeps artifacts. A job directory
gives each rank's figures and the slowest rank's (:func:`profiler.trackers.analysis.job_records`).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from profiler.trackers.analysis import Records, job_records, run_records
from profiler.trackers.base import Target, Tracker, TrackerError, check_installed, open_tracker

KEEP_ARTIFACTS = ("mlflow", "wandb")  # TensorBoard keeps no files but its events


@dataclass(frozen=True, slots=True)
class Export:
    """What a run gives each tracker: its records, its name there, and a writer of its HTML report."""

    records: Records
    run_name: str
    write_html: Callable[[Path], Path]


def read_export(run_dir: str | Path) -> Export:
    """The run's (or job's) records from its store alone; the store's own StoreError / JobDirError when it is
    not a readable run or job directory."""
    from profiler.jobs.jobdir import is_job_dir

    if is_job_dir(run_dir):
        return _job_export(run_dir)
    from profiler.render.html import write_html
    from profiler.runs.read import load

    rec, summary = load(run_dir)
    name = str(rec.meta.get("run_id") or Path(run_dir).name)
    return Export(run_records(rec, summary), name, lambda path: write_html(summary, rec, path))


def _job_export(job_dir: str | Path) -> Export:
    from profiler.analysis import summarize
    from profiler.jobs.analysis import summarize_job
    from profiler.jobs.jobdir import load_job
    from profiler.render.html import write_job_html

    job = load_job([job_dir])
    ranks, summaries = {}, {}
    for r in job.ranks:
        if r.record is not None:
            summaries[r.rank] = s = summarize(r.record)
            ranks[r.rank] = run_records(r.record, s)
    job_summary = summarize_job(job)
    return Export(job_records(ranks, summaries), Path(job_dir).name, lambda path: write_job_html(job_summary, path))


def write_records(tracker: Tracker, export: Export, html: Path | None) -> None:
    """Everything of ``export`` into one opened tracker (not closed here)."""
    tracker.log(export.records.points)
    write_figures(tracker, export, html)


def write_figures(tracker: Tracker, export: Export, html: Path | None) -> None:
    """``export``'s summary figures (at its last step), its words and its HTML report (where ``html`` is given):
    all but the step series, which a live logger has written as the run went (profiler.trackers.joblive)."""
    rec = export.records
    last = max((p.step for p in rec.points), default=0)
    tracker.log_summary(rec.summary, last)
    tracker.log_text("stall/verdict", rec.text)
    if html is not None:
        tracker.log_artifact(html)


def export_to(export: Export, targets: Sequence[Target]) -> list[str]:
    """Write ``export`` to each target; a line per target saying where. TrackerError (one line naming the
    target) for a package missing, or a tracker that cannot be opened or written."""
    for t in targets:
        check_installed(t)  # every package checked before anything is written
    said = []
    with tempfile.TemporaryDirectory(prefix="stallscope-report-") as tmp:
        keeps = any(t.kind in KEEP_ARTIFACTS for t in targets)  # the HTML made only where a tracker keeps it
        html = export.write_html(Path(tmp) / "stallscope-report.html") if keeps else None
        for t in targets:
            said.append(_export_one(t, export, html if t.kind in KEEP_ARTIFACTS else None))
    return said


def _export_one(target: Target, export: Export, html: Path | None) -> str:
    try:
        tracker = open_tracker(target, run_name=export.run_name)
    except TrackerError:
        raise
    except Exception as exc:  # noqa: BLE001 - the library's own error (an unwritable directory, no server): one line
        raise TrackerError(f"--to {target}: cannot open it: {type(exc).__name__}: {exc}") from None
    try:
        write_records(tracker, export, html)
    except Exception as exc:  # noqa: BLE001 - as above, once it is open
        raise TrackerError(f"--to {target}: writing failed: {type(exc).__name__}: {exc}") from None
    finally:
        tracker.close()
    n = len(export.records.points)
    where = getattr(tracker, "run_id", None)
    return f"wrote {n} points and {len(export.records.summary)} run figures to {target}" + (
        f" (run {where})" if where else ""
    )
