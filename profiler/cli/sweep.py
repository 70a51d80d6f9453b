"""``stallscope sweep`` and ``stallscope tune``: argument parsing and wiring only.

``profiler.cli`` registers the two subcommands with :func:`add_parsers` and dispatches through
:data:`HANDLERS`. This module computes no figure: ``sweep.run`` runs, ``sweep.analysis`` / ``sweep.tuner``
decide, ``render.sweep`` prints. Exit codes are ``stallscope run``'s: 0 ok (also when some configurations
failed: their rows say why), 1 when no configuration completed, 2 bad input, 130/143 stopped by
SIGINT/SIGTERM after writing and printing the table of what ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.cli.common import (
    DEFAULT_SCENARIO,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    MAX_BATCH,
    MAX_NPROC,
    MAX_WORKERS,
    BadInput,
    Handler,
    Training,
    add_training_options,
    base_run_config,
    bounded,
    exit_signal,
    int_list,
    live_monitor,
    prepare_out,
    resolve_training,
    say,
    stem,
)
from profiler.drivers.signals import SignalStop

if TYPE_CHECKING:
    from profiler.drivers.runner import TrainingError  # imports torch: only where a command trains
    from profiler.sweep.analysis import Config, SweepRow
    from profiler.sweep.run import Harness

MAX_BUDGET_S = 7 * 24 * 3600.0
DEFAULT_BUDGET_S = 300.0


def _name_list(text: str) -> list[str]:
    """Comma-separated pipeline names, in the order given, duplicates dropped; checked against the
    registry later (resolve_training) so that the message lists the registered names."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or any(not t for t in items):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty item: allowed a comma-separated list of pipelines")
    return list(dict.fromkeys(items))


def _limit_options(p: argparse.ArgumentParser, what: str) -> None:
    from profiler.sweep.analysis import DEFAULT_STEPS

    p.add_argument(
        "--steps",
        type=bounded(int, 1, None, "an integer"),
        help=f"cap on measured steps per {what} (default {DEFAULT_STEPS}; each stops earlier once stable)",
    )
    p.add_argument(
        "--seconds",
        type=bounded(float, 0.1, None, "a number of seconds"),
        metavar="S",
        help=f"cap on the measured seconds per {what} (alone: no step cap)",
    )


def add_parsers(sub: Any) -> None:
    """Register ``sweep`` and ``tune`` on the ``stallscope`` subparsers action."""
    _add_sweep(sub)
    _add_tune(sub)


_SCENARIO_HELP = f"built-in scenario name or path to a .py file (default {DEFAULT_SCENARIO})"


def _add_sweep(sub: Any) -> None:
    s = sub.add_parser(
        "sweep",
        help="train every pipeline x batch size x workers configuration briefly; table, knee, slowdowns, plot",
    )
    s.add_argument("scenario", nargs="?", default=None, help=_SCENARIO_HELP)
    s.add_argument("--pipelines", type=_name_list, default=["naive"], help="comma-separated (default naive)")
    s.add_argument(
        "--batch-sizes",
        type=int_list(1, MAX_BATCH),
        metavar="B,B,...",
        help="comma-separated (default: half, once and twice the scenario's batch size)",
    )
    s.add_argument(
        "--workers",
        type=int_list(0, MAX_WORKERS),
        metavar="W,W,...",
        help="comma-separated DataLoader worker counts (default 0 and min(2, cores))",
    )
    s.add_argument(
        "--nproc",
        type=int_list(1, MAX_NPROC),
        default=[1],
        metavar="N,N,...",
        help="comma-separated rank counts (default 1); N > 1 trains a data-parallel job of N ranks for --steps "
        "steps (docs/sweep-and-tune.md)",
    )
    _limit_options(s, "configuration")
    add_training_options(s)
    s.add_argument("--json", action="store_true", help='print only {"rows", "knee", "slowdowns", ...} on stdout')


def _add_tune(sub: Any) -> None:
    from profiler.sweep.plan import MAX_BATCH_FACTOR
    from profiler.sweep.tuner import WORKER_CAP

    t = sub.add_parser(
        "tune", help="search workers, batch size and pipeline for the best throughput within a time budget"
    )
    t.add_argument("scenario", nargs="?", default=None, help=_SCENARIO_HELP)
    t.add_argument(
        "--budget-s",
        type=bounded(float, 1, MAX_BUDGET_S, "a number of seconds"),
        default=DEFAULT_BUDGET_S,
        metavar="S",
        help=f"time for the search and the final comparison (default {DEFAULT_BUDGET_S:g})",
    )
    t.add_argument(
        "--max-batch-size",
        type=bounded(int, 1, MAX_BATCH, "an integer"),
        metavar="B",
        help=f"largest batch to try (default {MAX_BATCH_FACTOR}x the scenario's)",
    )
    t.add_argument(
        "--max-workers",
        type=bounded(int, 0, MAX_WORKERS, "an integer"),
        metavar="W",
        help=f"most DataLoader workers to try (default {WORKER_CAP}; past the cores, the workers' measured CPU use "
        "sets the ceiling)",
    )
    t.add_argument(
        "--pipelines", type=_name_list, help="comma-separated (default: every installed pipeline that can train it)"
    )
    _limit_options(t, "trial")
    add_training_options(t)
    t.add_argument("--nproc", help=argparse.SUPPRESS)  # refused with a pointer to sweep --nproc (cmd_tune)
    t.add_argument("--json", action="store_true", help='print only {"recommended", "default", "speedup", ...}')


def _precheck(names: Sequence[str], out: str | None) -> None:
    """The checks that need no torch, before resolve_training imports it (seconds on a busy machine)."""
    import pipelines  # the registry alone: no pipeline module is imported

    try:
        for name in names:
            if name not in pipelines.names():
                pipelines.get(name)  # raises the registry's PipelineError; an unknown name imports nothing
    except pipelines.PipelineError as exc:
        raise BadInput(f"--pipelines: {exc}") from None
    path = Path(out) if out is not None else None
    if (
        path is not None
        and path.is_dir()
        and ((path / "sweep.json").exists() or (path / "tune.json").exists() or any(path.glob("*/run.sqlite")))
    ):
        raise BadInput(f"--out '{out}' already holds a sweep or tune: choose a new directory")


def _out_dir(out: str | None, kind: str, scenario: str) -> Path:
    """The sweep or tune directory (created): ``out``, or runs/<kind>-<scenario>-<time>."""
    return prepare_out(out, f"{kind}-{stem(scenario)}")


def _harness(args: argparse.Namespace, training: Training, out: Path, what: str, guard: SignalStop) -> Harness:
    from profiler.sweep.analysis import DEFAULT_STEPS, SECONDS_ONLY_STEPS
    from profiler.sweep.render import row_line, start_line
    from profiler.sweep.run import Harness, Limits

    steps = args.steps or (SECONDS_ONLY_STEPS if args.seconds is not None else DEFAULT_STEPS)
    total = training.warmup + steps if steps < SECONDS_ONLY_STEPS else None  # None: only --seconds bounds a run

    def on_start(index: int, planned: int | None, cfg: Config, run_dir: Path) -> None:
        print(start_line(index, planned, cfg, run_dir, what), file=sys.stderr, flush=True)

    def on_finish(row: SweepRow) -> None:
        print(row_line(row), file=sys.stderr, flush=True)

    return Harness(
        scenario=training.scenario,
        base=base_run_config(args, training, out),
        limits=Limits(steps=steps, seconds=args.seconds),
        monitor=live_monitor(args.no_live, total),
        on_start=on_start,
        on_finish=on_finish,
        stop_requested=lambda: guard.received,
    )


def cmd_sweep(args: argparse.Namespace) -> int:
    from profiler.drivers.runner import TrainingError
    from profiler.sweep.plan import nproc_problem, sweep_configs
    from profiler.sweep.run import run_sweep

    _precheck(args.pipelines, args.out)
    training = resolve_training(args, args.pipelines, "--pipelines")
    scenario = training.scenario
    cuda = training.device.kind == "cuda"
    if problem := nproc_problem(args.nproc, seconds=args.seconds, steps=args.steps, cuda=cuda):
        raise BadInput(problem)
    configs = sweep_configs(args.pipelines, scenario.batch_size, args.batch_sizes, args.workers, args.nproc)
    out = _out_dir(args.out, "sweep", args.scenario)
    guard = SignalStop(defer_first=True)
    h = _harness(args, training, out, "sweep", guard)
    ranks = f" (rank counts {','.join(map(str, args.nproc))})" if max(args.nproc) > 1 else ""
    say(f"sweeping {scenario.name}: {len(configs)} configurations{ranks} on {training.device.label} -> {out}")
    try:
        with guard:
            result, stopped = run_sweep(h, configs, out)
    except TrainingError as exc:  # bad user data or an unwritable store: every configuration would fail alike
        return _stopped_early(exc, out / "sweep.json")
    from profiler.sweep.render import render_sweep, sweep_svg

    (out / "sweep.svg").write_text(sweep_svg(result))
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from profiler.render.report import make_console

        render_sweep(result, make_console(), out)
    if stopped:
        say(f"stopped by {stopped}; the table holds the configurations that ran")
        return exit_signal(stopped)
    return EXIT_OK if any(r.ok for r in result.rows) else EXIT_FAILED


def _stopped_early(exc: TrainingError, table: Path) -> int:
    """A sweep's or tune's end on a TrainingError that every configuration would meet alike: bad user data
    (exit 2), or a run store that cannot be written (exit 1; one line: what, and where what finished is)."""
    from profiler.sweep.run import store_failure

    failure = store_failure(exc)
    if failure is None:
        say(f"error: {exc.bad_input}")
        return EXIT_BAD_INPUT
    kept = f"what finished is in {table}" if table.exists() else "no configuration finished"
    say(f"{failure}; the {table.stem} ends here, every next configuration would fail alike; {kept}")
    return EXIT_FAILED


def cmd_tune(args: argparse.Namespace) -> int:
    import pipelines
    from profiler.drivers.runner import TrainingError
    from profiler.sweep.plan import tune_bounds
    from profiler.sweep.render import tune_header
    from profiler.sweep.run import run_tune, tune_pipelines

    if args.nproc is not None:
        raise BadInput(
            f"--nproc {args.nproc}: tune searches single-rank configurations; allowed: stallscope sweep SCENARIO "
            "--nproc 1,2,4 to measure rank counts"
        )
    _precheck(args.pipelines or pipelines.names(), args.out)
    training = resolve_training(args, args.pipelines or (), "--pipelines")
    scenario = training.scenario
    try:
        names, left_out = tune_pipelines(scenario, args.pipelines)
    except pipelines.PipelineError as exc:
        raise BadInput(f"--pipelines: {exc}") from None
    max_batch, max_workers = tune_bounds(scenario.batch_size, args.max_batch_size, args.max_workers, MAX_BATCH)
    cores = pipelines.usable_cores()
    out = _out_dir(args.out, "tune", args.scenario)
    guard = SignalStop(defer_first=True)
    h = _harness(args, training, out, "tune", guard)
    header = tune_header(
        scenario.name, pipelines=names, left_out=left_out, max_batch=max_batch, max_workers=max_workers, cores=cores,
        budget_s=args.budget_s,
    )  # fmt: skip
    say(f"{header} on {training.device.label} -> {out}")
    try:
        with guard:
            result = run_tune(
                h, out, pipelines=names, max_batch=max_batch, max_workers=max_workers, budget_s=args.budget_s,
                cores=cores, left_out=left_out, skip_inapplicable=args.pipelines is None,
                **({"min_trial_s": 0.0} if args.steps is not None else {}),
            )  # fmt: skip
    except TrainingError as exc:  # bad user data or an unwritable store, as in cmd_sweep
        return _stopped_early(exc, out / "tune.json")
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from profiler.render.report import make_console
        from profiler.sweep.render import render_tune

        render_tune(result, make_console(), out)
    if result.stopped_by:
        return exit_signal(result.stopped_by)
    return EXIT_OK if result.recommended is not None else EXIT_FAILED


HANDLERS: dict[str, Handler] = {"sweep": cmd_sweep, "tune": cmd_tune}
