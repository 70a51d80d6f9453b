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
import logging
import re
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
from profiler.cli.rayaddress import add_ray_address, apply_ray_address
from profiler.core.session import Interrupted
from profiler.drivers.signals import SignalStop
from profiler.sweep.defaults import DEFAULT_STEPS, MAX_BATCH_FACTOR, SECONDS_ONLY_STEPS, WORKER_CAP

if TYPE_CHECKING:
    from profiler.drivers.runner import TrainingError  # imports torch: only where a command trains
    from profiler.sweep.analysis import Config, SweepResult, SweepRow
    from profiler.sweep.run import Harness
    from profiler.sweep.tuner import TuneResult

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
    add_ray_address(s)
    s.add_argument("--json", action="store_true", help='print only {"rows", "knee", "slowdowns", ...} on stdout')


def _add_tune(sub: Any) -> None:
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
    t.add_argument(
        "--batch-sizes",
        type=int_list(1, MAX_BATCH),
        metavar="B,B,...",
        help="the batch sizes to try (default: a scenario's doubled and halved; a command's own only, since "
        "another batch size changes its training)",
    )
    t.add_argument("--dry-run", action="store_true", help="print the plan (what each trial runs) and run nothing")
    _limit_options(t, "trial")
    add_training_options(t)
    add_ray_address(t)
    t.add_argument("--nproc", help=argparse.SUPPRESS)  # refused with a pointer to sweep --nproc (cmd_tune)
    t.add_argument("--json", action="store_true", help='print only {"recommended", "default", "speedup", ...}')


def _precheck(names: Sequence[str], out: str | None) -> None:
    """The checks that need no torch, before resolve_training imports it (seconds on a busy machine)."""
    import pipelines  # the registry alone: no pipeline module is imported

    try:
        for name in names:
            pipelines.check(name)
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
    _precheck(args.pipelines, args.out)
    from profiler.drivers.runner import TrainingError
    from profiler.sweep.plan import nproc_problem, sweep_configs
    from profiler.sweep.run import run_sweep

    training = resolve_training(args, args.pipelines, "--pipelines")
    apply_ray_address(args)
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
    return _sweep_outcome(args, result, stopped, out)


def _sweep_outcome(args: argparse.Namespace, result: SweepResult, stopped: str | None, out: Path) -> int:
    """Write the plot, print the table (or its JSON) and give the exit code of a sweep that ran."""
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

    if args.nproc is not None:
        raise BadInput(
            f"--nproc {args.nproc}: tune searches single-rank configurations; allowed: stallscope sweep SCENARIO "
            "--nproc 1,2,4 to measure rank counts"
        )
    _precheck(args.pipelines or pipelines.names(), args.out)
    from profiler.drivers.runner import TrainingError
    from profiler.sweep.plan import tune_bounds
    from profiler.sweep.render import tune_header
    from profiler.sweep.run import run_tune, tune_pipelines

    training = resolve_training(args, args.pipelines or (), "--pipelines")
    apply_ray_address(args)
    scenario = training.scenario
    try:
        names, left_out = tune_pipelines(scenario, args.pipelines)
    except pipelines.PipelineError as exc:
        raise BadInput(f"--pipelines: {exc}") from None
    max_batch, max_workers = tune_bounds(scenario.batch_size, args.max_batch_size, args.max_workers, MAX_BATCH)
    cores = pipelines.usable_cores()
    if args.dry_run:
        return _print_plan(
            scenario.name, args, first=f"{', '.join(names)}: batch {scenario.batch_size}, 0 workers (the setting to "
            "beat: the naive pipeline)", knobs="", max_workers=max_workers, cores=cores,
            batches=f"the listed {args.batch_sizes}" if args.batch_sizes else f"doubled while it helps, up to "
            f"{max_batch}, else halved while it helps",
            for_real="trains the scenario in this process, {measured} measured after its warm-up",
        )  # fmt: skip
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
                cores=cores, left_out=left_out, skip_inapplicable=args.pipelines is None, batches=args.batch_sizes,
                **({"min_trial_s": 0.0} if args.steps is not None else {}),
            )  # fmt: skip
    except TrainingError as exc:  # bad user data or an unwritable store, as in cmd_sweep
        return _stopped_early(exc, out / "tune.json")
    return _tune_outcome(args, result, out)


def _tune_outcome(args: argparse.Namespace, result: TuneResult, out: Path) -> int:
    """Print the tune's table and verdict (or its JSON) and give its exit code."""
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from profiler.render.report import make_console
        from profiler.sweep.render import render_tune

        render_tune(result, make_console(), out)
    if result.stopped_by:
        return exit_signal(result.stopped_by)
    return EXIT_OK if result.recommended is not None else EXIT_FAILED


def _print_plan(what: str, args: argparse.Namespace, **plan: Any) -> int:
    from profiler.sweep.plan import tune_plan
    from profiler.sweep.run import trial_seconds

    seconds = trial_seconds(args.seconds, args.budget_s)
    print("\n".join(tune_plan(what, seconds=seconds, steps=args.steps, budget_s=args.budget_s, **plan)))
    return EXIT_OK


# tune -- CMD: the flags that only a scenario's training reads (name -> its default)
_SCENARIO_ONLY = {
    "pipelines": None, "max_batch_size": None, "nproc": None, "device": "auto", "warmup": None, "seed": 0,
    "model": None, "data": None, "on_bad_sample": "fail", "synthetic_input": False, "price_per_hour": None,
    "precision": "default", "channels_last": False,
}  # fmt: skip


def _refuse_scenario_flags(args: argparse.Namespace, sweep: bool) -> None:
    """A scenario's flags given with ``-- CMD``: BadInput naming the first."""
    only = {**_SCENARIO_ONLY, **({"pipelines": ["naive"], "nproc": [1]} if sweep else {})}
    for name, default in only.items():
        if getattr(args, name, default) != default:
            flag = "--" + name.replace("_", "-")
            raise BadInput(
                f"{flag}: a scenario's option; {args.command.split('-')[0]} -- CMD changes only the "
                "command's DataLoader knobs"
            )


def _command_spec(args: argparse.Namespace, seconds: float | None, guard: SignalStop, what: str) -> Any:
    from profiler.sweep.command import CommandSpec
    from profiler.sweep.render import row_line, trial_line

    return CommandSpec(
        command=args.command_argv, seconds=seconds, steps=args.steps,
        batch_sizes=tuple(args.batch_sizes) if args.batch_sizes else None, sample_hz=args.sample_hz,
        on_start=lambda i, run_dir, overrides: say(trial_line(what, i, run_dir, overrides)),
        on_finish=lambda row: print(row_line(row), file=sys.stderr, flush=True), stop_requested=lambda: guard.received,
    )  # fmt: skip


def _quiet_repeats() -> None:
    once = _Once()
    for handler in logging.getLogger().handlers:
        handler.addFilter(once)


def cmd_sweep_command(args: argparse.Namespace) -> int:
    """``sweep [OPTIONS] -- CMD``: the command unchanged, then each workers (x batch size) setting of its loader."""
    from profiler.sweep.command import CommandFailed, run_command_sweep, usable_command
    from profiler.sweep.plan import default_workers

    _refuse_scenario_flags(args, sweep=True)
    if problem := usable_command(args.command_argv, args.steps or (None if args.seconds else DEFAULT_STEPS)):
        raise BadInput(problem)
    out = _out_dir(args.out, "sweep", _script(args.command_argv))
    guard = SignalStop(defer_first=True)
    if args.steps is None and args.seconds is None:
        args.steps = DEFAULT_STEPS
    spec = _command_spec(args, args.seconds, guard, "sweep")
    workers = args.workers if args.workers is not None else default_workers()
    say(f"sweeping the DataLoader of {' '.join(args.command_argv)} (each run runs it for real) -> {out}")
    _quiet_repeats()
    try:
        with guard:
            result, stopped = run_command_sweep(spec, out, workers=workers, batch_sizes=args.batch_sizes)
    except CommandFailed as exc:
        say(f"error: the command, run unchanged, gave no step to sweep from: {exc} (its run: {out / 'own'})")
        return EXIT_FAILED
    return _sweep_outcome(args, result, stopped, out)


def cmd_tune_command(args: argparse.Namespace) -> int:
    """``tune [OPTIONS] -- CMD``: the command's DataLoader tuned through the start-up module (sweep.command)."""
    import pipelines
    from profiler.sweep.command import CommandFailed, run_command_tune, usable_command
    from profiler.sweep.run import trial_seconds

    command = args.command_argv
    _refuse_scenario_flags(args, sweep=False)
    if problem := usable_command(command, args.steps):
        raise BadInput(problem)
    cores = pipelines.usable_cores()
    max_workers = args.max_workers if args.max_workers is not None else WORKER_CAP
    script = _script(command)
    if args.dry_run:
        return _print_plan(
            " ".join(command), args, first="the command unchanged: its training DataLoader's knobs are the setting "
            "to beat", knobs="; with workers, persistent_workers=True",
            max_workers=max_workers, cores=cores,
            batches=f"the listed {args.batch_sizes} (this changes the training)" if args.batch_sizes else "the "
            "script's own (--batch-sizes B,B,... to try others: that changes the training)",
            for_real="runs the command for real (it trains, and writes what it writes); {measured} measured from its "
            "first batch, then the start-up module in it ends it",
        )  # fmt: skip
    out = _out_dir(args.out, "tune", script)
    guard = SignalStop(defer_first=True)
    spec = _command_spec(args, trial_seconds(args.seconds, args.budget_s), guard, "tune")
    _quiet_repeats()
    say(f"tuning the DataLoader of {' '.join(command)} (budget {args.budget_s:g} s; each trial runs it) -> {out}")
    try:
        with guard:
            result = run_command_tune(spec, out, max_workers=max_workers, budget_s=args.budget_s, cores=cores)
    except CommandFailed as exc:
        say(f"error: the command, run unchanged, gave no step to tune from: {exc} (its run: {out / 't01-script'})")
        return EXIT_FAILED
    except Interrupted as exc:  # during the first trial: the setting to beat was not measured
        say(f"stopped by {exc.signame} before the command's own setting was measured; what ran: {out}")
        return exit_signal(exc.signame)
    return _tune_outcome(args, result, out)


class _Once(logging.Filter):
    """Each warning once a tune (every trial's recording warns alike: NVML missing, say)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        key = re.sub(r"[0-9.]+", "#", message)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _script(command: Sequence[str]) -> str:
    """The name a command's tune directory gets: its first .py argument's, else the program's."""
    return next((Path(a).stem for a in command[1:] if a.endswith(".py")), Path(command[0]).name)


HANDLERS: dict[str, Handler] = {
    "sweep": cmd_sweep, "tune": cmd_tune, "tune-command": cmd_tune_command, "sweep-command": cmd_sweep_command,
}  # fmt: skip
