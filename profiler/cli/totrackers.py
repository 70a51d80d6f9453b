"""``report RUN --to TARGET``: the run's figures into an experiment tracker (profiler.trackers.export), with the
CLI's exit codes: a bad target, a tracker's package missing, or a tracker that cannot be written is one line,
exit 2."""

from __future__ import annotations

import argparse

from profiler.cli.common import EXIT_OK, BadInput, say


def add_to_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--to",
        action="append",
        metavar="TARGET",
        help="also write the run's stall/ figures, verdict and HTML report to a tracker: tensorboard:DIR, "
        "mlflow[:TRACKING_URI] or wandb (repeatable)",
    )


def add_log_to_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-to",
        action="append",
        metavar="TARGET",
        help="log the run's stall/ figures to a tracker while it runs, every --log-every seconds: "
        "tensorboard:DIR, mlflow[:TRACKING_URI] or wandb (repeatable)",
    )
    parser.add_argument(
        "--log-every",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between two points logged with --log-to (default 10, as the trackers' system metrics)",
    )


def checked_log_to(args: argparse.Namespace) -> tuple[str, ...]:
    """``--log-to``'s targets, each checked (its form, its package installed) before anything runs."""
    from profiler.trackers.base import TargetError, TrackerError, check_installed, parse_targets

    if not args.log_to:
        return ()
    if getattr(args, "nproc", None) is not None and getattr(args, "nnodes", 1) > 1:
        # a node's launcher sees its own ranks' stores only, so no node knows the job's slowest rank while it runs
        raise BadInput(
            f"--log-to: not with --nnodes {args.nnodes}: each node sees only its own ranks; log the job after it "
            "with report JOB_DIR ... --to TARGET"
        )
    if not args.log_every > 0:
        raise BadInput(f"--log-every {args.log_every:g}: allowed a number of seconds > 0")
    try:
        targets = parse_targets(args.log_to)
        for t in targets:
            check_installed(t)
    except (TargetError, TrackerError) as exc:
        raise BadInput(f"--log-to {exc}") from None
    return tuple(str(t) for t in targets)


def report_to(args: argparse.Namespace) -> int:
    from profiler.core.store import StoreError
    from profiler.jobs.jobdir import JobDirError
    from profiler.trackers.base import TargetError, TrackerError, parse_targets
    from profiler.trackers.export import export_to, read_export

    try:
        targets = parse_targets(args.to)
    except TargetError as exc:
        raise BadInput(f"--to {exc}") from None
    try:
        export = read_export(args.run_dir)
    except (StoreError, JobDirError) as exc:
        raise BadInput(str(exc)) from None
    try:
        for line in export_to(export, targets):
            say(line)
    except TrackerError as exc:
        raise BadInput(str(exc)) from None
    return EXIT_OK
