"""``stallscope report``, ``compare``, ``watch`` and ``scenarios``: parsers and handlers. These are the commands
that read a run store back (a run prints the Summary it built at close instead)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    BadInput,
    Handler,
    add_prometheus_option,
    bounded,
    exit_signal,
    exporter_for,
    follow_store,
    load_job_summary,
    print_job,
    print_summary,
    say,
)
from profiler.cli.totrackers import add_to_option, report_to

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.analysis.timeline import Timeline
    from profiler.core.rows import RunRecord
    from profiler.core.store.columns import RunColumns
    from profiler.runs.read import Bulk


def add_parsers(sub: Any) -> None:
    """Register ``report``, ``compare``, ``watch`` and ``scenarios``."""
    rep = sub.add_parser("report", help="rebuild the report of a stored run (also one killed half-way) or of a job")
    rep.add_argument(
        "run_dir", help="a run directory, a job directory (job.json, rank-R/), or a sweep or tune directory"
    )
    rep.add_argument(
        "more_dirs", nargs="*", metavar="RUN_DIR2", help="the other nodes' directories of the same job (merged)"
    )
    rep.add_argument("--json", action="store_true", help="print the summary JSON")
    rep.add_argument(
        "--baseline", metavar="RUN_DIR", help="job directories: the run scaling efficiency is measured against"
    )
    rep.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--trace", metavar="FILE", help="also write a Chrome/Perfetto trace-event JSON file")
    add_to_option(rep)

    cmp = sub.add_parser("compare", help="compare run B against baseline run A; exit 1 when B regresses")
    cmp.add_argument("run_a")
    cmp.add_argument("run_b")
    cmp.add_argument(
        "--max-stall-increase",
        type=bounded(float, 0, 100, "a number"),
        metavar="PP",
        help="fail when B's stall fraction exceeds A's by more than PP percentage points",
    )
    cmp.add_argument(
        "--max-throughput-drop",
        type=bounded(float, 0, 100, "a number"),
        metavar="PCT",
        help="fail when B's throughput is more than PCT percent below A's",
    )
    cmp.add_argument("--json", action="store_true", help="print the comparison JSON")

    w = sub.add_parser(
        "watch", help="follow a run (or a multi-rank job) another process is writing, live, from its store"
    )
    w.add_argument("run_dir", help="a run directory, or a job directory (job.json, rank-R/)")
    w.add_argument("--json", action="store_true", help="at the end, print the summary JSON instead of the report")
    add_prometheus_option(w)

    sub.add_parser("scenarios", help="list the built-in scenarios")


def load(run_dir: str | Path) -> tuple[RunRecord, Summary]:
    """A stored run read back once: (its record, its Summary); BadInput naming what is wrong with the store."""
    from profiler.core.store import StoreError
    from profiler.runs.read import load as load_run_summary

    try:
        return load_run_summary(run_dir)
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def _cached(run_dir: str | Path) -> tuple[Summary, Timeline] | None:
    """A closed run's report cache (profiler.runs.cache), None where it is not the store's own or the run is a
    zero-code job (whose report reads its ranks' rows); BadInput naming what is wrong with the store."""
    from profiler.core.store import StoreError
    from profiler.runs.cache import read_cache

    try:
        return None if _zero_code(run_dir) else read_cache(run_dir)
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def _zero_code(run_dir: str | Path) -> bool:
    """A zero-code job's store (its report reads its ranks' rows); BadInput naming what is wrong with the store."""
    from profiler.core.store import StoreError, read_head
    from profiler.zerocode.analysis import is_zero_code

    try:
        return is_zero_code(read_head(run_dir)[0])
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def _write_trace_of(run_dir: str | Path, target: str, columns: RunColumns | None = None) -> Path:
    """A run's trace, reading only what it draws (``runs.read.load_for_trace``), or taking it from the ``columns``
    already read: the same trace either way."""
    from profiler.core.store import StoreError
    from profiler.render.trace import write_trace
    from profiler.runs.read import load_for_trace, trace_of_columns

    try:
        got = load_for_trace(run_dir) if columns is None else trace_of_columns(run_dir, columns)
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    return write_trace(got.record, target, got.summarised, got.steps)


def load_summary(run_dir: str | Path) -> Summary:
    return load(run_dir)[1]


def _is_job(path: str) -> bool:
    from profiler.jobs.jobdir import is_job_dir

    return is_job_dir(path)


def cmd_report(args: argparse.Namespace) -> int:
    from profiler.cli.tables import report_table, table_file

    if args.to:  # the run's figures into experiment trackers, from the store alone
        return report_to(args)
    dirs = [args.run_dir, *args.more_dirs]
    if not args.more_dirs and (table := table_file(args.run_dir)) is not None:
        return report_table(table, args)  # a sweep or tune directory
    if any(_is_job(d) for d in dirs):
        return _report_job(args, dirs)
    if args.more_dirs:
        raise BadInput(
            f"'{args.more_dirs[0]}': report takes one RUN_DIR, or several job directories (the nodes of one job)"
        )
    if args.baseline is not None:
        raise BadInput(f"--baseline '{args.baseline}': allowed only with a job directory (job.json, rank-R/)")
    cached = _cached(args.run_dir)
    if cached is not None:  # a closed run: its Summary and plots as built at close, no row read (docs/store.md)
        summary, timeline = cached
        _write_files(
            args,
            lambda target: _html_of(summary, timeline, target),
            lambda target: _write_trace_of(args.run_dir, target),
        )
        print_summary(summary, args.json)
        return EXIT_OK
    from profiler.zerocode.analysis import zero_code_job

    if _zero_code(args.run_dir):  # a job's report reads its ranks' rows
        rec, summary = load(args.run_dir)
        _write_files(args, lambda target: _html(summary, rec, target), lambda target: _trace(rec, target))
        print_summary(summary, args.json, zero_code_job(rec))
        return EXIT_OK
    # a run with no cache of its own (killed, interrupted, or written by other code): its store read in bulk,
    # the cache written where the store will not change again (docs/store.md, "The report cache")
    bulk = _bulk(args.run_dir, timeline=args.html is not None)
    _write_files(
        args,
        lambda target: _html_of_bulk(bulk, target),
        lambda target: _write_trace_of(args.run_dir, target, bulk.columns),
    )
    print_summary(bulk.summary, args.json)
    return EXIT_OK


def _html_of_bulk(bulk: Bulk, target: str) -> Path:
    assert bulk.timeline is not None  # load_bulk builds it where --html asks for it
    return _html_of(bulk.summary, bulk.timeline, target)


def _bulk(run_dir: str | Path, *, timeline: bool) -> Bulk:
    """The store read in bulk (``runs.read.load_bulk``); BadInput naming what is wrong with the store."""
    from profiler.core.store import StoreError
    from profiler.runs.read import load_bulk

    try:
        return load_bulk(run_dir, timeline=timeline)
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def _html_of(summary: Summary, timeline: Timeline, target: str) -> Path:
    from profiler.render.html import write_html_of  # imported where written: --trace alone, or neither, needs none

    return write_html_of(summary, timeline, target)


def _html(summary: Summary, rec: RunRecord, target: str) -> Path:
    from profiler.render.html import write_html

    return write_html(summary, rec, target)


def _trace(rec: RunRecord, target: str) -> Path:
    from profiler.render.trace import write_trace

    return write_trace(rec, target)


def _report_job(args: argparse.Namespace, dirs: list[str]) -> int:
    from profiler.render.html import write_job_html
    from profiler.render.trace import write_job_trace

    job_summary, job = load_job_summary(dirs, args.baseline)
    _write_files(args, lambda target: write_job_html(job_summary, target), lambda target: write_job_trace(job, target))
    print_job(job_summary, args.json)
    return EXIT_OK


def _write_files(args: argparse.Namespace, html: Callable[[str], Path], trace: Callable[[str], Path]) -> None:
    """``--html`` and ``--trace``; when the second cannot be written the first is removed again, so that an exit 2
    leaves nothing behind."""
    written: list[Path] = []
    for flag, target, write in (("--html", args.html, html), ("--trace", args.trace, trace)):
        if target is None:
            continue
        try:
            written.append(write(target))
        except (OSError, ValueError) as exc:
            for path in written:
                path.unlink(missing_ok=True)
            raise BadInput(f"{flag} '{target}' cannot be written: {exc}") from None
    for path in written:
        say(f"wrote {path}")


def _compared(run_dir: str) -> Summary | dict[str, object]:
    """What ``compare`` reads of a directory: a run's Summary, or a summary dict: a job's (its single-run keys),
    or a finished run's own ``summary.json`` (see :func:`stored_summary`)."""
    if _is_job(run_dir):
        return load_job_summary([run_dir])[0].to_dict()
    stored = stored_summary(run_dir)
    # a summary.json written before step_spread existed: summarised again, so the comparison knows the run's noise
    return stored if stored is not None and "step_spread" in stored else _read_summary(run_dir)


def _read_summary(run_dir: str) -> Summary:
    """A run's Summary: from its report cache, else from its store read in bulk (which writes the cache where the
    store will not change again); a zero-code job's from its rows."""
    if _zero_code(run_dir):
        return load_summary(run_dir)
    cached = _cached(run_dir)
    return cached[0] if cached is not None else _bulk(run_dir, timeline=False).summary


def stored_summary(run_dir: str | Path) -> dict[str, object] | None:
    """The run's own ``summary.json`` when current (:func:`profiler.runs.read.stored_summary`), else None;
    BadInput naming what is wrong with the store."""
    from profiler.core.store import StoreError
    from profiler.runs.read import stored_summary as read_stored

    try:
        return read_stored(run_dir)
    except StoreError as exc:
        raise BadInput(str(exc)) from None


def cmd_compare(args: argparse.Namespace) -> int:
    from profiler.analysis.compare import compare

    a, b = _compared(args.run_a), _compared(args.run_b)
    result = compare(
        a, b, max_stall_increase_pp=args.max_stall_increase, max_throughput_drop_pct=args.max_throughput_drop
    )
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from profiler.render.compare import render_compare
        from profiler.render.report import make_console

        render_compare(result, make_console())
    return EXIT_FAILED if result.regressed else EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    from profiler.core.store import StoreError, resolve_db
    from profiler.live.feeds import StoreFeed
    from profiler.live.render import watch

    if _is_job(args.run_dir):
        return _watch_job(args)
    try:
        resolve_db(args.run_dir)
        feed = StoreFeed(args.run_dir)
        feed.poll()
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    if feed.status() == "running":
        try:
            with exporter_for(args) as exporter, follow_store(exporter, args.run_dir):
                say(f"watching {args.run_dir} (Ctrl-C stops watching, not the run)")
                watch(feed)
        except KeyboardInterrupt:
            return exit_signal("SIGINT")
        except StoreError as exc:  # removed, replaced or damaged while watched
            raise BadInput(str(exc)) from None
    print_summary(load_summary(args.run_dir), args.json)
    return EXIT_OK


def _watch_job(args: argparse.Namespace) -> int:
    """``watch JOB_DIR``: the job's live view from its rank stores until the launcher's status leaves running."""
    from profiler.jobs.render_live import watch_job
    from profiler.live.feeds import JobFeed

    feed = JobFeed(args.run_dir)
    feed.poll()
    if feed.status() == "running":
        try:
            with exporter_for(args) as exporter, follow_store(exporter, args.run_dir, job=True):
                say(f"watching job {args.run_dir} (Ctrl-C stops watching, not the job)")
                watch_job(feed)
        except KeyboardInterrupt:
            return exit_signal("SIGINT")
    print_job(load_job_summary([args.run_dir])[0], args.json)
    return EXIT_OK


def cmd_scenarios(args: argparse.Namespace) -> int:
    import scenarios

    for name in scenarios.names():
        sc = scenarios.get(name)
        models = sc.model_names()
        extra = f" [models: {', '.join(models)}]" if len(models) > 1 else ""
        print(f"{name:16s} {sc.description}{extra}")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {
    "report": cmd_report,
    "compare": cmd_compare,
    "watch": cmd_watch,
    "scenarios": cmd_scenarios,
}
