"""``stallscope report``, ``compare``, ``watch`` and ``scenarios``: parsers and handlers. These are the commands
that read a run store back (a run prints the Summary it built at close instead)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from profiler.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    BadInput,
    Handler,
    bounded,
    exit_signal,
    print_summary,
    say,
)


def add_parsers(sub: Any) -> None:
    """Register ``report``, ``compare``, ``watch`` and ``scenarios``."""
    rep = sub.add_parser("report", help="rebuild the report of a stored run (also one killed half-way)")
    rep.add_argument("run_dir")
    rep.add_argument("--json", action="store_true", help="print the summary JSON")
    rep.add_argument("--html", metavar="FILE", help="also write a self-contained HTML report")
    rep.add_argument("--trace", metavar="FILE", help="also write a Chrome/Perfetto trace-event JSON file")

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

    w = sub.add_parser("watch", help="follow a run another process is writing, live, from its store")
    w.add_argument("run_dir")
    w.add_argument("--json", action="store_true", help="at the end, print the summary JSON instead of the report")

    sub.add_parser("scenarios", help="list the built-in scenarios")


def load(run_dir: str | Path) -> tuple[Any, Any]:
    """A stored run read back once: (its record, its Summary); BadInput naming what is wrong with the store."""
    from profiler.analysis import summarize
    from profiler.store import StoreError, load_run

    try:
        rec = load_run(run_dir)
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    return rec, summarize(rec)


def load_summary(run_dir: str | Path) -> Any:
    return load(run_dir)[1]


def cmd_report(args: argparse.Namespace) -> int:
    from profiler.render.html import write_html
    from profiler.render.trace import write_trace

    rec, summary = load(args.run_dir)
    for flag, target in (("--html", args.html), ("--trace", args.trace)):
        if target is None:
            continue
        try:
            written = write_html(summary, rec, target) if flag == "--html" else write_trace(rec, target)
        except (OSError, ValueError) as exc:
            raise BadInput(f"{flag} '{target}' cannot be written: {exc}") from None
        say(f"wrote {written}")
    print_summary(summary, args.json)
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from profiler.analysis.compare import compare

    a, b = load_summary(args.run_a), load_summary(args.run_b)
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
    from profiler.feeds import StoreFeed
    from profiler.render.live import watch
    from profiler.store import StoreError, resolve_db

    try:
        resolve_db(args.run_dir)
        feed = StoreFeed(args.run_dir)
        feed.poll()
    except StoreError as exc:
        raise BadInput(str(exc)) from None
    if feed.status() == "running":
        say(f"watching {args.run_dir} (Ctrl-C stops watching, not the run)")
        try:
            watch(feed)
        except KeyboardInterrupt:
            return exit_signal("SIGINT")
    print_summary(load_summary(args.run_dir), args.json)
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
