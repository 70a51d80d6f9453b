"""``stallscope run`` (a scenario under the profiler), ``run -- CMD`` and ``attach PID`` (zero-code): parsers
and handlers. Each prints the Summary its run built at close; none reads the store back."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.cli.common import (
    DEFAULT_PYSPY_RATE,
    DEFAULT_SCENARIO,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    MAX_BATCH,
    MAX_PREFETCH,
    MAX_WORKERS,
    BadInput,
    Handler,
    Training,
    add_prometheus_option,
    add_training_options,
    base_run_config,
    bounded,
    exit_signal,
    exporter_for,
    keep_made,
    kernel_windows_arg,
    live_monitor,
    loader_knobs,
    positive_hz,
    prepare_out,
    print_summary,
    report_outcome,
    resolve_training,
    say,
    stem,
)
from profiler.cli.job import add_job_options, check_job_options, cmd_job
from profiler.cli.rayaddress import add_ray_address, apply_ray_address
from profiler.cli.totrackers import add_log_to_option, checked_log_to
from profiler.drivers.signals import SignalStop

if TYPE_CHECKING:
    from profiler.drivers.runner import TrainingError
    from profiler.export.prometheus import PrometheusExporter
    from profiler.zerocode.profile import ZeroCodeResult


def add_parsers(sub: Any) -> None:
    """Register ``run`` and ``attach``."""
    _add_run(sub)
    _add_attach(sub)


def _add_run(sub: Any) -> None:
    r = sub.add_parser("run", help="train a scenario under the profiler and print a stall report")
    scenario_help = f"built-in scenario name or path to a .py file (default {DEFAULT_SCENARIO})"
    r.add_argument("scenario", nargs="?", default=None, help=scenario_help)
    r.add_argument("--pipeline", default="naive", help="naive | prefetch | dali | ray: how batches reach the device")
    r.add_argument("--batch-size", type=bounded(int, 1, MAX_BATCH, "an integer"), help="default: the scenario's")
    r.add_argument(
        "--workers",
        type=bounded(int, 0, MAX_WORKERS, "an integer"),
        default=0,
        help="DataLoader worker processes (DALI: CPU threads) (default 0)",
    )
    _add_loader_knobs(r)
    r.add_argument("--steps", type=bounded(int, 1, None, "an integer"), help="measured steps (default: the scenario's)")
    add_training_options(r)
    add_ray_address(r)
    r.add_argument("--json", action="store_true", help="print only the summary JSON on stdout")
    r.add_argument(
        "--augment-epochs",
        type=bounded(int, 0, None, "an integer"),
        metavar="N",
        help="augment only the first N epochs, then train on plain data (fashion-vgg, cifar-vgg; default: all)",
    )
    r.add_argument(
        "--loader-only",
        action="store_true",
        help="no model: iterate the pipeline and the copy to the device, to measure the loader's prep rate",
    )
    r.add_argument(
        "--headspace",
        action="store_true",
        help="before training, iterate a second loader of the run's pipeline alone for a few seconds: its rate "
        "beside what the training consumed says whether the loader could keep up (docs/pipelines.md, 'Headspace')",
    )
    _add_storage_options(r)
    _add_kernel_windows_option(r)
    r.add_argument(
        "--pyspy-rate",
        type=bounded(int, 1, 1000, "an integer"),
        default=None,
        metavar="HZ",
        help="py-spy sampling rate for zero-code runs (`run -- CMD`) and loader attribution (default 10)",
    )
    r.add_argument(
        "--no-instrument",
        action="store_true",
        help="zero-code (`run -- CMD`): do not load the start-up module that times the script's DataLoaders "
        "(the figures are then py-spy estimates)",
    )
    r.add_argument(
        "--no-attribution",
        action="store_true",
        help="with --workers > 0: do not sample the workers with py-spy for the loader attribution",
    )
    add_job_options(r)
    add_prometheus_option(r)
    add_log_to_option(r)
    r.epilog = "Zero-code: `stallscope run [OPTIONS] -- python train.py ARGS...` profiles an unmodified script."


def _add_loader_knobs(r: Any) -> None:
    """The DataLoader's own knobs (naive, prefetch): what ``tune`` may recommend, to run as it did."""
    r.add_argument(
        "--prefetch-factor",
        type=bounded(int, 1, MAX_PREFETCH, "an integer"),
        metavar="N",
        help="batches each DataLoader worker loads ahead (naive, prefetch; with --workers 1 or more; default 2)",
    )
    r.add_argument(
        "--pin-memory",
        choices=("on", "off"),
        help="page-locked batches, for a faster copy to a CUDA device (modelled on a simulated one) (naive, "
        "prefetch; default: naive off, prefetch on where the device is CUDA)",
    )


def _add_storage_options(r: Any) -> None:
    """Where a scenario's data set is read from: an emulated store, and the page cache before the run."""
    r.add_argument(
        "--store-mbps",
        type=bounded(float, 0.001, 1e6, "a number"),
        metavar="MB/S",
        help="read the data set as from a store of this many MB/s serving one read at a time: each file read is "
        "paced (torch pipelines; docs/pipelines.md, 'An emulated store')",
    )
    r.add_argument(
        "--dali-stages",
        action="store_true",
        help="--pipeline dali on an image-folder scenario: before training, run the graph's prefixes alone (the "
        "reader; + the decoder; the whole graph) to time each stage (DALI gives no per-operator times)",
    )
    r.add_argument(
        "--page-cache",
        choices=("warm", "cold"),
        help="before the run, read the data set's files once (warm) or drop them from the page cache (cold, "
        "posix_fadvise: no root needed)",
    )


def _add_attach(sub: Any) -> None:
    at = sub.add_parser("attach", help="profile a running training process from outside (py-spy + sampler)")
    at.add_argument("pid", type=bounded(int, 1, 2**22, "a process id"))
    at.add_argument(
        "--duration",
        type=bounded(float, 0.1, None, "a number of seconds"),
        metavar="S",
        help="stop after S seconds (default: when the process exits, or Ctrl-C)",
    )
    at.add_argument("--sample-hz", type=positive_hz, default=10.0)
    at.add_argument("--pyspy-rate", type=bounded(int, 1, 1000, "an integer"), default=None, metavar="HZ")
    at.add_argument("--out", help="run directory to create (default runs/pid<PID>-<time>)")
    at.add_argument("--json", action="store_true")
    at.add_argument("--no-live", action="store_true")
    add_prometheus_option(at)


# the commands that take ``-- CMD``, and the handler each then dispatches to
COMMAND_HANDLERS = {"run": "run-command", "tune": "tune-command", "sweep": "sweep-command"}


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``run|tune|sweep [OPTIONS] -- CMD ...``: the stallscope arguments and the command (None without ``--``)."""
    if "--" in argv and argv and argv[0] in COMMAND_HANDLERS:
        cut = argv.index("--")
        return argv[:cut], argv[cut + 1 :]
    return argv, None


def check_command(args: argparse.Namespace, command: list[str]) -> None:
    """``run|tune|sweep -- CMD``: BadInput unless there is exactly a command (and no scenario)."""
    verb = "profile" if args.command == "run" else args.command
    if not command:
        raise BadInput(
            f"nothing after `--`: give the command to {verb}, e.g. `stallscope {args.command} -- python train.py`"
        )
    if args.scenario is not None:
        raise BadInput(f"give a scenario ({args.scenario!r}) or a command after `--`, not both")
    if getattr(args, "store_mbps", None) is not None or getattr(args, "page_cache", None):
        raise BadInput("--store-mbps and --page-cache act on a scenario's data set: not allowed with a command")
    if any(v is not None for v in loader_knobs(args).values()):
        raise BadInput(
            "--prefetch-factor and --pin-memory set a scenario's loader: not allowed with a command "
            "(`stallscope tune -- CMD` tries them on the script's DataLoader)"
        )
    args.command_argv = command
    apply_ray_address(args)  # the command's own ray.init() finds it in RAY_ADDRESS
    if args.command in ("tune", "sweep"):
        args.command = COMMAND_HANDLERS[args.command]
        return
    if args.nproc is not None:
        raise BadInput("--nproc launches a scenario's ranks; for your own job: stallscope run -- torchrun ...")
    args.command = COMMAND_HANDLERS["run"]


def cmd_run(args: argparse.Namespace) -> int:
    check_job_options(args)
    _check_flags(args)  # before the scenario's default data set is made: a bad pair of flags is told at once
    checked_log_to(args)  # a bad target, or a tracker's package missing: told before anything runs
    t = resolve_training(args, [args.pipeline])
    apply_ray_address(args)
    with exporter_for(args) as exporter:
        if args.nproc is not None:
            return cmd_job(args, t, exporter)
        return _run_scenario(args, t, exporter)


def _add_kernel_windows_option(r: argparse.ArgumentParser) -> None:
    r.add_argument(
        "--kernel-windows",
        type=kernel_windows_arg,
        default="auto",
        metavar="off|auto|AFTER:STEPS[:EVERY]",
        help="record the device's kernels, copies and sets (CUPTI on CUDA; the simulated device's own on sim:) for "
        "STEPS steps from AFTER steps past the warm-up, then every EVERY steps; auto: 5:20:2000 (docs/metrics.md, "
        "'The GPU's own view')",
    )


def _run_scenario(args: argparse.Namespace, t: Training, exporter: PrometheusExporter | None) -> int:
    out = prepare_out(args.out, f"{stem(args.scenario)}-{args.pipeline}")
    from profiler.drivers.runner import RunStopped, TrainingError, run_scenario

    steps = args.steps or t.scenario.steps
    _check_storage(args, t)
    cfg = replace(
        base_run_config(args, t, out),
        pipeline=args.pipeline,
        batch_size=args.batch_size,
        workers=args.workers,
        **loader_knobs(args),
        steps=steps,
        attribution=not args.no_attribution,
        pyspy_rate=args.pyspy_rate or DEFAULT_PYSPY_RATE,
        loader_only=args.loader_only,
        augment_epochs=args.augment_epochs,
        store_mbps=args.store_mbps,
        page_cache=args.page_cache,
        dali_stages=args.dali_stages,
        headspace=args.headspace,
        kernel_windows=args.kernel_windows,
        log_to=checked_log_to(args),
        log_every_s=args.log_every,
    )
    if not args.json:
        what = "loading (no model)" if args.loader_only else "training"
        say(f"{what} {t.scenario.name} ({args.pipeline}, device {t.device.label}) -> {out}")
    try:
        with SignalStop():
            session = run_scenario(t.scenario, cfg, live_monitor(args.no_live, t.warmup + steps, exporter))
    except TrainingError as exc:
        return _training_failed(exc, out, args.json)
    except RunStopped as exc:
        say(f"stopped by {exc.signame}; reporting what was measured")
        return report_outcome(exc.session.summary(), out, args.json, exit_signal(exc.signame))
    except Exception as exc:  # noqa: BLE001 - set-up failed before any step: nothing was measured, say what
        say(f"training set-up failed: {type(exc).__name__}: {exc}")
        return EXIT_FAILED
    finally:
        _serve_final(exporter, out)
    failure = session.recording.failure
    if failure is not None:  # its last writes, at close, failed
        say(f"{failure}; the run ended, {failure.kept}")
        return EXIT_FAILED
    return report_outcome(session.summary(), out, args.json, EXIT_OK)


def _serve_final(exporter: PrometheusExporter | None, out: Path) -> None:
    """The run's last figures stay served until the command ends: from its store, where the sampler process
    served them while it ran (its end closed its side of the endpoint)."""
    if exporter is None or exporter.serving:
        return
    from profiler.core.store import StoreError
    from profiler.live.feeds import StoreFeed

    try:
        feed = StoreFeed(out)
    except (StoreError, OSError):  # set-up failed before the store was made: nothing to serve
        return
    exporter.show(feed)


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that exclude each other whatever the scenario: --dali-stages times a DALI graph's stages, --headspace
    sets the loader alone beside a training."""
    if args.dali_stages and args.pipeline != "dali":
        raise BadInput(f"--dali-stages times a DALI graph's stages: allowed with --pipeline dali, not {args.pipeline}")
    if args.headspace and (args.loader_only or args.synthetic_input):
        what = "--loader-only" if args.loader_only else "--synthetic-input"
        raise BadInput(f"--headspace sets the loader alone beside the training: not allowed with {what}")
    knob = "--prefetch-factor" if args.prefetch_factor is not None else "--pin-memory" if args.pin_memory else None
    if knob is not None and args.pipeline not in ("naive", "prefetch"):
        raise BadInput(f"{knob} sets a DataLoader knob: allowed with --pipeline naive or prefetch, not {args.pipeline}")
    if args.prefetch_factor is not None and args.workers == 0:
        raise BadInput(
            f"--prefetch-factor {args.prefetch_factor} is the batches each worker process loads ahead: allowed with "
            "--workers 1 or more, not 0"
        )


def _check_storage(args: argparse.Namespace, t: Training) -> None:
    """--store-mbps / --page-cache act on a file-backed scenario's files, read by a torch pipeline."""
    flag = "--store-mbps" if args.store_mbps is not None else "--page-cache" if args.page_cache else None
    if flag is None:
        return
    if t.data is None and (flag == "--page-cache" or not args.scenario.endswith(".py")):
        # a scenario file's data set may pace its own reads (pipelines.store.pace); a built-in one reads no files
        raise BadInput(f"{flag}: scenario {t.scenario.name!r} reads no files: allowed with imagenet or ssd")
    if args.store_mbps is not None and args.pipeline == "dali":
        raise BadInput("--store-mbps paces the torch pipelines' file reads: allowed with --pipeline naive or prefetch")


def _training_failed(exc: TrainingError, out: Path, as_json: bool) -> int:
    """A TrainingError's exit: bad input (2), the run store that could not be written (1, one line: what, and
    which steps it kept; the report would claim steps the store lacks), or the training itself (1, report)."""
    from profiler.core.store import StoreWriteError

    if isinstance(exc.__cause__, StoreWriteError):
        keep_made(out)  # what the store committed is the user's
        say(str(exc.__cause__))
        return EXIT_FAILED
    if exc.bad_input:
        say(f"error: {exc.bad_input}")
        summary = exc.session.summary() if exc.session else None
        if summary is not None and summary.steps > 0:  # found mid-run: what was measured is kept
            keep_made(out)
            say(f"the partial run is kept: stallscope report {out}")
        return EXIT_BAD_INPUT
    say(f"training failed: {exc.where}; the partial run is kept: stallscope report {out}")
    return report_outcome(exc.session.summary() if exc.session else None, out, as_json, EXIT_FAILED)


def _external(args: argparse.Namespace, *, command: list[str] | None, pid: int | None, name: str) -> int:
    with exporter_for(args) as exporter:
        return _profile_external(args, command, pid, name, exporter)


def _profile_external(
    args: argparse.Namespace, command: list[str] | None, pid: int | None, name: str, exporter: PrometheusExporter | None
) -> int:
    from profiler.core.sampling.pyspy import DEFAULT_RATE
    from profiler.live.feeds import StoreFeed
    from profiler.zerocode.profile import profile_external

    out = prepare_out(args.out, f"{stem(name)}-zero-code")
    if (windows := getattr(args, "kernel_windows", None)) is not None:
        from profiler.zerocode.boot.stallscope_instrument import WINDOWS_ENV

        os.environ[WINDOWS_ENV] = windows  # into the command's environment: its start-up module reads it
    if not args.json:
        say(f"profiling {' '.join(command) if command else f'pid {pid}'} from outside -> {out}")
    try:
        # Ctrl-C reaches the command and stallscope alike, and `timeout -s INT` signals stallscope twice (itself,
        # then its group): the first stops the run, the next would cut the command's reaping and the close short
        with SignalStop(ignore_more=True):
            result = profile_external(
                out,
                command=command,
                pid=pid,
                sample_hz=args.sample_hz,
                pyspy_rate=args.pyspy_rate or DEFAULT_RATE,
                duration_s=getattr(args, "duration", None),
                instrument=command is not None and not getattr(args, "no_instrument", False),
                child_stdout=sys.stderr if args.json else None,
                monitor=live_monitor(args.no_live, None, exporter, lambda: StoreFeed(out)),
            )
    except FileNotFoundError as exc:
        raise BadInput(str(exc)) from None
    return _external_outcome(args, result, out, started=command is not None)


def _external_outcome(args: argparse.Namespace, result: ZeroCodeResult, out: Path, *, started: bool) -> int:
    """The exit code of ``run -- CMD`` / ``attach``, and what is printed: the report, or for a command (``started``
    here) that ended, failed or stopped, before anything could be measured, one line saying so and where the run
    is. A signal is told as a shell tells it (128 + the signal: Ctrl-C is 130); a stopped run exits so too."""
    from profiler.render.figures import command_end

    stopped = result.status == "interrupted"
    signame = (result.error or "SIGINT").rsplit(" ", 1)[-1] if stopped else None
    code = exit_signal(signame) if stopped else EXIT_FAILED if result.exit_code else EXIT_OK
    s = result.summary
    how = command_end(result.exit_code)
    ended = stopped or bool(result.exit_code)
    if started and ended and s is not None and s.steps == 0 and s.verdict.startswith("unknown"):
        took = f" after {result.ran_s:.1f} s" if result.ran_s is not None else ""
        when = f"stopped by {signame}{took}" if stopped else f"the command {how}{took}"
        also = f"; the command {how}" if stopped and result.exit_code else ""
        say(f"{when}, {_nothing_measured(result)}{also}: no report (what was recorded: stallscope report {out})")
        if args.json:
            print_summary(s, True, result.job)
        return code
    if stopped:
        also = f"; the command {how}" if result.exit_code else ""
        n = s.steps if s else 0
        what = f"the {n} step{'' if n == 1 else 's'} measured" if n else "what was measured"
        say(f"stopped by {signame}{also}; report of {what} follows")
    elif result.exit_code:
        say(f"the command {how}; report of what was measured follows")
    return report_outcome(s, out, args.json, code, result.job)


def _nothing_measured(result: ZeroCodeResult) -> str:
    """What the command got to before it ended: no batch, or a few not yet a measured step."""
    batches = sum(int(lo.get("next_calls") or 0) for lo in result.facts.get("loaders") or [])
    if batches:
        return f"with {batches} DataLoader batch{'es' if batches != 1 else ''} and no step measured"
    return "before any DataLoader batch"


def cmd_run_command(args: argparse.Namespace) -> int:
    if args.log_to:  # the script's own Session(log_to=...) logs; stallscope's records no step of its own here
        raise BadInput("--log-to: not with -- CMD: use report RUN_DIR --to TARGET after it")
    command = args.command_argv
    name = Path(command[1]).stem if len(command) > 1 and command[1].endswith(".py") else Path(command[0]).name
    return _external(args, command=command, pid=None, name=name)


def cmd_attach(args: argparse.Namespace) -> int:
    from profiler.core.store import pid_alive

    if not pid_alive(args.pid):
        raise BadInput(f"pid {args.pid} is not a running process: allowed the pid of a running training process")
    return _external(args, command=None, pid=args.pid, name=f"pid{args.pid}")


HANDLERS: dict[str, Handler] = {"run": cmd_run, "run-command": cmd_run_command, "attach": cmd_attach}
