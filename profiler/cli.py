"""Command line: argument parsing, exit codes and wiring only.

Exit codes: 0 ok; 2 bad input (one line on stderr naming the value and what is allowed, no traceback);
1 the training failed (the partial run is kept and reportable); 130/143 stopped by SIGINT/SIGTERM after a
clean end of the run (report printed). No figure is computed here.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from profiler import cli_sweep
from profiler.sampler import MAX_HZ

if TYPE_CHECKING:
    from profiler.runner import RunConfig

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}
MAX_BATCH = 65536
MAX_WORKERS = 256
DEFAULT_SCENARIO = "fashion-vgg"
DEFAULT_PYSPY_RATE = 10  # profiler.pyspy.DEFAULT_RATE, without importing it for --help


class BadInput(Exception):
    """Bad user input: printed as one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage first; one line naming the problem is what a user can act on
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_BAD_INPUT)


def _bounded(kind: Callable[[str], Any], lo: float, hi: float | None, what: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < lo or (hi is not None and value > hi) or math.isnan(value):
            allowed = f"{lo:.10g}..{hi:.10g}" if hi is not None else f">= {lo:.10g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: allowed {allowed}")
        return value

    return parse


def _positive_hz(text: str) -> float:
    try:
        hz = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < hz <= MAX_HZ:
        raise argparse.ArgumentTypeError(f"{text} is out of range: allowed 0 < HZ <= {MAX_HZ:g}")
    return hz


def add_training_options(p: argparse.ArgumentParser) -> None:
    """The flags ``run``, ``sweep`` and ``tune`` share."""
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument("--warmup", type=_bounded(int, 0, None, "an integer"), help="warm-up steps, not measured")
    p.add_argument(
        "--sample-hz", type=_positive_hz, default=10.0, help=f"sampler rate, 0 < HZ <= {MAX_HZ:g} (default 10)"
    )
    p.add_argument("--seed", type=_bounded(int, 0, 2**32 - 1, "an integer"), default=0)
    p.add_argument("--out", help="directory to create (default under runs/)")
    p.add_argument("--no-live", action="store_true", help="no live status while training")
    p.add_argument("--model", help="one of the scenario's models (see `stallscope scenarios`); default its first")
    p.add_argument(
        "--data",
        metavar="DIR",
        help="data directory of a file-backed scenario (default: a small set generated once into "
        "$STALLSCOPE_DATA, else ~/.cache/stallscope)",
    )
    p.add_argument(
        "--on-bad-sample",
        choices=("fail", "skip"),
        default="fail",
        help="a corrupt or non-image file in --data: fail (exit 2 naming it) or skip (counted and listed)",
    )
    p.add_argument(
        "--price-per-hour",
        type=_bounded(float, 0, 1e6, "a number"),
        metavar="P",
        help="price of the machine per hour: the report adds the cost per 1,000 samples and per epoch",
    )


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="stallscope", description="Is the accelerator waiting for data, and what would fix it?")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    r = sub.add_parser("run", help="train a scenario under the profiler and print a stall report")
    r.add_argument(
        "scenario",
        nargs="?",
        default=None,
        help=f"built-in scenario name or path to a .py file (default {DEFAULT_SCENARIO})",
    )
    r.add_argument("--pipeline", default="naive", help="naive | prefetch | dali: how batches reach the device")
    r.add_argument("--batch-size", type=_bounded(int, 1, MAX_BATCH, "an integer"), help="default: the scenario's")
    r.add_argument(
        "--workers",
        type=_bounded(int, 0, MAX_WORKERS, "an integer"),
        default=0,
        help="DataLoader worker processes (DALI: CPU threads) (default 0)",
    )
    r.add_argument(
        "--steps", type=_bounded(int, 1, None, "an integer"), help="measured steps (default: the scenario's)"
    )
    add_training_options(r)
    r.add_argument("--json", action="store_true", help="print only the summary JSON on stdout")
    r.add_argument(
        "--augment-epochs",
        type=_bounded(int, 0, None, "an integer"),
        metavar="N",
        help="augment only the first N epochs, then train on plain data (fashion-vgg, cifar-vgg; default: all)",
    )
    r.add_argument(
        "--loader-only",
        action="store_true",
        help="no model: iterate the pipeline and the copy to the device, to measure the loader's prep rate",
    )
    r.add_argument(
        "--pyspy-rate",
        type=_bounded(int, 1, 1000, "an integer"),
        default=None,
        metavar="HZ",
        help="py-spy sampling rate for zero-code runs (`run -- CMD`) and loader attribution (default 10)",
    )
    r.add_argument(
        "--no-attribution",
        action="store_true",
        help="with --workers > 0: do not sample the workers with py-spy for the loader attribution",
    )
    r.epilog = "Zero-code: `stallscope run [OPTIONS] -- python train.py ARGS...` profiles an unmodified script."

    at = sub.add_parser("attach", help="profile a running training process from outside (py-spy + sampler)")
    at.add_argument("pid", type=_bounded(int, 1, 2**22, "a process id"))
    at.add_argument(
        "--duration",
        type=_bounded(float, 0.1, None, "a number of seconds"),
        metavar="S",
        help="stop after S seconds (default: when the process exits, or Ctrl-C)",
    )
    at.add_argument("--sample-hz", type=_positive_hz, default=10.0)
    at.add_argument("--pyspy-rate", type=_bounded(int, 1, 1000, "an integer"), default=None, metavar="HZ")
    at.add_argument("--out", help="run directory to create (default runs/pid<PID>-<time>)")
    at.add_argument("--json", action="store_true")
    at.add_argument("--no-live", action="store_true")

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
        type=_bounded(float, 0, 100, "a number"),
        metavar="PP",
        help="fail when B's stall fraction exceeds A's by more than PP percentage points",
    )
    cmp.add_argument(
        "--max-throughput-drop",
        type=_bounded(float, 0, 100, "a number"),
        metavar="PCT",
        help="fail when B's throughput is more than PCT percent below A's",
    )
    cmp.add_argument("--json", action="store_true", help="print the comparison JSON")

    w = sub.add_parser("watch", help="follow a run another process is writing, live, from its store")
    w.add_argument("run_dir")
    w.add_argument("--json", action="store_true", help="at the end, print the summary JSON instead of the report")

    sub.add_parser("scenarios", help="list the built-in scenarios")

    d = sub.add_parser("data", help="generate local data sets (never downloaded)")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    dm = dsub.add_parser("make", help="write a generated data set; a no-op on a complete directory")
    dm.add_argument("kind", help="imagenet-like (ImageFolder of JPEGs) | voc-like (detection JPEGs + COCO json)")
    dm.add_argument("--out", required=True, metavar="DIR")
    dm.add_argument("--count", type=_bounded(int, 1, 10_000_000, "an integer"), required=True, metavar="N")
    dm.add_argument("--classes", type=_bounded(int, 1, 100_000, "an integer"), default=10, metavar="K")
    dm.add_argument("--seed", type=_bounded(int, 0, 2**32 - 1, "an integer"), default=0, metavar="S")
    dm.add_argument("--jobs", type=_bounded(int, 1, 1024, "an integer"), help="processes (default: all cores)")
    cli_sweep.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] | None = None
    if "--" in argv and argv and argv[0] == "run":
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    if command is not None:
        if not command:
            print(
                "stallscope: error: nothing after `--`: give the command to profile, e.g. "
                "`stallscope run -- python train.py`",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        if args.scenario is not None:
            print(
                f"stallscope: error: give a scenario ({args.scenario!r}) or a command after `--`, not both",
                file=sys.stderr,
            )
            return EXIT_BAD_INPUT
        args.command_argv = command
        args.command = "run-command"
    handler = {
        "run-command": cmd_run_command,
        "attach": cmd_attach,
        "run": cmd_run,
        "report": cmd_report,
        "watch": cmd_watch,
        "compare": cmd_compare,
        "scenarios": cmd_scenarios,
        "data": cmd_data,
        **cli_sweep.HANDLERS,
    }[args.command]
    try:
        return handler(args)
    except BadInput as exc:
        print(f"stallscope: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _print_summary(summary: Any, as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary.to_dict(), indent=2))
        return
    from profiler.render.report import make_console, render_report

    render_report(summary, make_console())


def _stem(scenario: str) -> str:
    """A scenario's name in a directory name: a .py file's stem, else the name itself."""
    return Path(scenario).stem if scenario.endswith(".py") else scenario


def _prepare_out(out: str | None, default_name: str) -> Path:
    """The run (or sweep, tune) directory, created and checked writable; ``out`` None: runs/<default_name>-<time>."""
    if out is None:
        out = os.path.join("runs", f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    path = Path(out)
    if (path / "run.sqlite").exists():
        raise BadInput(f"--out '{out}' already holds a run: choose a new directory")
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out '{out}' is a file: allowed a directory that holds no run yet")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".stallscope-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise BadInput(f"--out '{out}' is not writable: {exc.strerror or exc}") from None
    return path


class _SignalStop:
    """Turns SIGINT/SIGTERM into :class:`Interrupted` in the main thread while a run trains.

    ``defer_first`` (sweep, tune): the first signal only records its name in ``received``: the configuration in
    flight stops at its next measured step (the stop rule polls ``received``) and no further one starts, so the
    signal never lands inside library code (a DataLoader's ``__del__``, a source probe) that would print or
    swallow an exception raised there. A second signal raises at once, for a step that never ends."""

    def __init__(self, defer_first: bool = False) -> None:
        self.defer_first = defer_first
        self.received: str | None = None

    def __enter__(self) -> _SignalStop:
        from profiler.session import Interrupted

        def handler(signum: int, _frame: Any) -> None:
            name = signal.Signals(signum).name
            if self.received is None:
                self.received = name
                if self.defer_first:
                    return
            raise Interrupted(name)

        self._old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


@dataclass(frozen=True, slots=True)
class Training:
    """What ``run``, ``sweep`` and ``tune`` resolved from their shared flags, before any run directory exists."""

    scenario: Any
    device: Any
    data: Path | None
    extra_meta: dict[str, Any]


def resolve_training(args: argparse.Namespace, pipeline_names: Sequence[str] = ()) -> Training:
    """Check the shared flags (BadInput naming the value) and make the scenario's default data if it needs it."""
    import pipelines
    import scenarios
    from profiler.devices import resolve_device

    args.scenario = args.scenario or DEFAULT_SCENARIO
    try:
        scenario = scenarios.get(args.scenario)
        for name in pipeline_names:  # checked before a run directory is made; raises naming the allowed ones
            pipelines.get(name)
        scenario.model_factory(args.model)
        device = resolve_device(args.device)
    except ValueError as exc:  # ScenarioError, PipelineError, DeviceError, or an unknown --model
        raise BadInput(str(exc)) from None
    data = None
    if scenario.data is None:
        if args.data is not None:
            raise BadInput(f"--data {args.data!r}: scenario {scenario.name!r} generates its data in memory")
    elif args.data is not None:
        data = Path(args.data)
        if not data.is_dir():
            what = "does not exist" if not data.exists() else "is not a directory"
            raise BadInput(f"--data {args.data!r} {what}: allowed an existing data directory")
    else:
        data = _default_data(scenario.data, scenario.data_count)
    meta: dict[str, Any] = {}
    if args.price_per_hour is not None:
        meta["price_per_hour"] = args.price_per_hour
    return Training(scenario, device, data, meta)


def base_run_config(args: argparse.Namespace, t: Training, out: Path) -> RunConfig:
    """What ``run``, ``sweep`` and ``tune`` configure alike from their shared flags; each replaces the rest."""
    from profiler.runner import RunConfig

    return RunConfig(
        out=out,
        device=t.device,
        warmup=args.warmup,
        sample_hz=args.sample_hz,
        seed=args.seed,
        data=t.data,
        on_bad_sample=args.on_bad_sample,
        model=args.model,
        extra_meta=t.extra_meta,
    )


def _default_data(kind: str, count: int) -> Path:
    from profiler.render.progress import progress
    from scenarios.datagen import DataError, ensure_default

    try:
        with progress(f"stallscope: generating the default {kind} set ({count} images, once)") as report:
            return ensure_default(kind, count, progress=report)
    except DataError as exc:
        raise BadInput(str(exc)) from None


def cmd_run(args: argparse.Namespace) -> int:
    t = resolve_training(args, [args.pipeline])
    scenario, device = t.scenario, t.device
    out = _prepare_out(args.out, f"{_stem(args.scenario)}-{args.pipeline}")

    from profiler.runner import TrainingError, run_scenario
    from profiler.session import Interrupted

    cfg = replace(
        base_run_config(args, t, out),
        pipeline=args.pipeline,
        batch_size=args.batch_size,
        workers=args.workers,
        steps=args.steps,
        attribution=not args.no_attribution,
        pyspy_rate=args.pyspy_rate or DEFAULT_PYSPY_RATE,
        loader_only=args.loader_only,
        augment_epochs=args.augment_epochs,
    )
    monitor = None
    if not args.no_live:
        from profiler.feeds import SessionFeed
        from profiler.render.live import monitor_for

        total = (args.steps or scenario.steps) + (scenario.warmup if args.warmup is None else args.warmup)

        def monitor(s: Any) -> Any:
            return monitor_for(SessionFeed(s), total_steps=total)

    if not args.json:
        what = "loading (no model)" if args.loader_only else "training"
        print(
            f"stallscope: {what} {scenario.name} ({args.pipeline}, device {device.torch_device}) -> {out}",
            file=sys.stderr,
        )
    code = EXIT_OK
    try:
        with _SignalStop():
            run_scenario(scenario, cfg, monitor)
    except TrainingError as exc:
        if exc.bad_input:
            print(f"stallscope: error: {exc.bad_input}", file=sys.stderr)
            return EXIT_BAD_INPUT
        print(
            f"stallscope: training failed: {exc.where}; the partial run is kept: stallscope report {out}",
            file=sys.stderr,
        )
        code = EXIT_FAILED
    except (Interrupted, KeyboardInterrupt) as exc:
        name = getattr(exc, "signame", "SIGINT")
        print(f"stallscope: stopped by {name}; reporting what was measured", file=sys.stderr)
        code = EXIT_SIGNAL.get(name, 130)
    except Exception as exc:  # set-up failed before any step: nothing was measured
        print(f"stallscope: training set-up failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return _report_dir(out, args.json, code)


def _report_dir(run_dir: Path | str, as_json: bool, code: int = EXIT_OK) -> int:
    from profiler.analysis import summarize
    from profiler.store import StoreError, load_run

    try:
        summary = summarize(load_run(run_dir))
    except StoreError as exc:
        if code != EXIT_OK:
            return code
        raise BadInput(str(exc)) from None
    _print_summary(summary, as_json)
    return code


def cmd_report(args: argparse.Namespace) -> int:
    from profiler.store import StoreError

    for flag, target in (("--html", args.html), ("--trace", args.trace)):
        if target is None:
            continue
        if flag == "--html":
            from profiler.render.html import write_html as write
        else:
            from profiler.render.trace import write_trace as write
        try:
            written = write(args.run_dir, target)
        except StoreError as exc:
            raise BadInput(str(exc)) from None
        except (OSError, ValueError) as exc:
            raise BadInput(f"{flag} '{target}' cannot be written: {exc}") from None
        print(f"stallscope: wrote {written}", file=sys.stderr)
    return _report_dir(args.run_dir, args.json)


def cmd_compare(args: argparse.Namespace) -> int:
    from profiler.analysis import summarize
    from profiler.analysis.compare import compare
    from profiler.store import StoreError, load_run

    try:
        a, b = summarize(load_run(args.run_a)), summarize(load_run(args.run_b))
    except StoreError as exc:
        raise BadInput(str(exc)) from None
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


def _external(args: argparse.Namespace, *, command: list[str] | None, pid: int | None, stem: str) -> int:
    from profiler.pyspy import DEFAULT_RATE
    from profiler.zerocode import profile_external

    out = _prepare_out(args.out, f"{_stem(stem)}-zero-code")
    monitor = None
    if not args.no_live:
        from profiler.feeds import StoreFeed
        from profiler.render.live import monitor_for

        def monitor(d: Path) -> Any:
            return monitor_for(StoreFeed(d))

    if not args.json:
        what = " ".join(command) if command else f"pid {pid}"
        print(f"stallscope: profiling {what} from outside -> {out}", file=sys.stderr)
    try:
        with _SignalStop():
            result = profile_external(
                out,
                command=command,
                pid=pid,
                sample_hz=args.sample_hz,
                pyspy_rate=args.pyspy_rate or DEFAULT_RATE,
                duration_s=getattr(args, "duration", None),
                child_stdout=sys.stderr if args.json else None,
                monitor=monitor,
            )
    except FileNotFoundError as exc:
        raise BadInput(str(exc)) from None
    if result.exit_code:
        print(
            f"stallscope: the command exited with code {result.exit_code}; report of what was measured follows",
            file=sys.stderr,
        )
    code = EXIT_FAILED if result.exit_code else EXIT_SIGNAL["SIGINT"] if result.status == "interrupted" else EXIT_OK
    return _report_dir(out, args.json, code)


def cmd_run_command(args: argparse.Namespace) -> int:
    command = args.command_argv
    stem = Path(command[1]).stem if len(command) > 1 and command[1].endswith(".py") else Path(command[0]).name
    return _external(args, command=command, pid=None, stem=stem)


def cmd_attach(args: argparse.Namespace) -> int:
    from profiler.store import pid_alive

    if not pid_alive(args.pid):
        raise BadInput(f"pid {args.pid} is not a running process: allowed the pid of a running training process")
    return _external(args, command=None, pid=args.pid, stem=f"pid{args.pid}")


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
        print(f"stallscope: watching {args.run_dir} (Ctrl-C stops watching, not the run)", file=sys.stderr)
        try:
            watch(feed)
        except KeyboardInterrupt:
            return EXIT_SIGNAL["SIGINT"]
    return _report_dir(args.run_dir, args.json)


def cmd_scenarios(args: argparse.Namespace) -> int:
    import scenarios

    for name in scenarios.names():
        sc = scenarios.get(name)
        models = sc.model_names()
        extra = f" [models: {', '.join(models)}]" if len(models) > 1 else ""
        print(f"{name:16s} {sc.description}{extra}")
    return EXIT_OK


def cmd_data(args: argparse.Namespace) -> int:
    from profiler.render.progress import progress
    from scenarios.datagen import DataError, make

    try:
        with progress(f"stallscope: {args.kind} -> {args.out}") as report:
            info = make(
                args.kind, Path(args.out), args.count, classes=args.classes, seed=args.seed, jobs=args.jobs,
                progress=report,
            )  # fmt: skip
    except DataError as exc:
        raise BadInput(str(exc)) from None
    if info.generated == 0:
        print(f"stallscope: {args.out} already holds this {args.kind} set ({info.count} images): nothing to do")
    else:
        print(f"stallscope: wrote {info.generated} {args.kind} images to {args.out} ({info.count} in the set)")
    return EXIT_OK
