"""What every ``stallscope`` command shares: bad input and exit codes, bounded numbers, the training options of
``run``/``sweep``/``tune`` resolved once, run directories, printing a Summary or a job's, and ``--prometheus``.

Exit codes: 0 ok; 2 bad input (one line on stderr naming the value and what is allowed, no traceback);
1 the training failed (the partial run is kept and reportable); 130/143 stopped by SIGINT/SIGTERM after a
clean end of the run (report printed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from profiler.core.sampler_process.views import ViewRecipe
from profiler.core.sampling.sampler import MAX_HZ
from profiler.sweep.defaults import MAX_BATCH_FACTOR

if TYPE_CHECKING:
    from profiler.analysis.summary import Summary
    from profiler.core.steps.device_timers import DeviceInfo
    from profiler.drivers.precision import Precision
    from profiler.drivers.runner import RunConfig
    from profiler.export.endpoint import Endpoint
    from profiler.export.prometheus import PrometheusExporter
    from profiler.jobs.analysis import JobInput, JobSummary
    from profiler.live.feeds import LiveFeed
    from profiler.zerocode.analysis import ZeroCodeJob
    from scenarios import Scenario

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}
MAX_BATCH = 65536
MAX_WORKERS = 256
MAX_PREFETCH = 64  # --prefetch-factor's ceiling: batches a worker holds ahead, each a batch of host memory
MAX_NPROC = 64
DEFAULT_SCENARIO = "fashion-vgg"
DEFAULT_PYSPY_RATE = 10  # profiler.core.sampling.pyspy.DEFAULT_RATE, without importing it for --help

Handler = Callable[[argparse.Namespace], int]


class BadInput(Exception):
    """Bad user input: printed as one line, exit 2."""


class Parser(argparse.ArgumentParser):
    has_commands = False  # True once it has subcommands: its unknown arguments are theirs to name

    def error(self, message: str) -> NoReturn:
        # argparse prints the whole usage first; one line naming the problem is what a user can act on
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        sys.exit(EXIT_BAD_INPUT)

    def add_subparsers(self, **kwargs: Any) -> Any:
        self.has_commands = True
        return super().add_subparsers(**kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """As argparse's, but a subcommand's unknown arguments are its error, not its caller's: the message names
        this subcommand's help (where its flags are) and the nearest flag it has."""
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and not self.has_commands:
            self.error(f"unrecognized arguments: {' '.join(extra)}{self.nearest(extra)}")
        return parsed, extra

    def nearest(self, extra: Sequence[str]) -> str:
        """``: did you mean --steps?`` for ``--stpes``, or "" when no flag of this command is near."""
        import difflib
        import re

        # the flags a user can see (hidden ones are not in the usage line), compared without their "--": a near
        # miss shares most of its letters with the flag, not just the dashes
        names = re.findall(r"--([A-Za-z0-9][\w-]*)", self.format_usage())
        near = [
            f"--{hit[0]}"
            for word in extra
            if word.startswith("--")
            and (hit := difflib.get_close_matches(word[2:].split("=", 1)[0], names, n=1, cutoff=0.75))
        ]
        return f": did you mean {' or '.join(dict.fromkeys(near))}?" if near else ""


# Line breaks and other control characters in a value quoted by a message (a path holding a newline) are shown
# escaped, so that every message stays one line.
_ESCAPED = {c: repr(chr(c))[1:-1] for c in (*range(32), 127, 0x85, 0x2028, 0x2029)}


def say(message: str) -> None:
    """One progress or status line on stderr (stdout is kept for the report or the JSON)."""
    print(f"stallscope: {message.translate(_ESCAPED)}", file=sys.stderr, flush=True)


def exit_signal(name: str | None) -> int:
    """The exit code of a run stopped by signal ``name``."""
    return EXIT_SIGNAL.get(name or "SIGINT", 130)


Number = TypeVar("Number", int, float)


def bounded(kind: Callable[[str], Number], lo: float, hi: float | None, what: str) -> Callable[[str], Number]:
    """An argparse ``type``: ``kind(text)`` within ``lo``..``hi`` (None: no upper bound), else one clear line."""

    def parse(text: str) -> Number:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if value < lo or (hi is not None and value > hi) or math.isnan(value):
            allowed = f"{lo:.10g}..{hi:.10g}" if hi is not None else f">= {lo:.10g}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: allowed {allowed}")
        return value

    return parse


def kernel_windows_arg(text: str) -> str:
    """``--kernel-windows``: checked here, kept as text (the Session parses it again)."""
    from profiler.core.kernel_windows.windows import RECORDER_ENV, KernelWindowError, own_factory, parse_plan

    try:
        if parse_plan(text) is not None and (own := os.environ.get(RECORDER_ENV)):
            own_factory(own)  # a recorder of one's own that cannot be had: said before anything runs
    except KernelWindowError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def int_list(lo: int, hi: int) -> Callable[[str], list[int]]:
    """Parser of a comma-separated list of integers in lo..hi: sorted, duplicates dropped."""
    allowed = f"allowed a comma-separated list of integers {lo}..{hi}, e.g. 8,16,32"

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",")]
        if not text.strip() or any(not t for t in items):
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: {allowed}")
        out = set()
        for t in items:
            try:
                v = int(t)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{t!r} in {text!r} is not an integer: {allowed}") from None
            if not lo <= v <= hi:
                raise argparse.ArgumentTypeError(f"{v} in {text!r} is out of range: {allowed}")
            out.add(v)
        return sorted(out)

    return parse


def positive_hz(text: str) -> float:
    try:
        hz = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < hz <= MAX_HZ:
        raise argparse.ArgumentTypeError(f"{text} is out of range: allowed 0 < HZ <= {MAX_HZ:g}")
    return hz


def add_training_options(p: argparse.ArgumentParser) -> None:
    """The flags ``run``, ``sweep`` and ``tune`` share."""
    from profiler.drivers.precision import PRECISIONS

    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="default",
        help="the arithmetic of a built-in scenario's training on a real device: default (PyTorch's own: TF32 "
        "convolutions on CUDA), fp32, tf32, bf16 or fp16 (autocast; fp16 with a GradScaler, CUDA only); the run "
        "records what ran (docs/scenarios.md, 'Precision')",
    )
    p.add_argument("--channels-last", action="store_true", help="the model and its 4-d inputs in channels_last")
    p.add_argument(
        "--device",
        default="auto",
        help="auto | cpu | cuda | cuda:N | sim:NAME[,precision=P][,efficiency=E][,link=L] (default auto; docs/sim.md)",
    )
    p.add_argument("--warmup", type=bounded(int, 0, None, "an integer"), help="warm-up steps, not measured")
    p.add_argument(
        "--sample-hz", type=positive_hz, default=10.0, help=f"sampler rate, 0 < HZ <= {MAX_HZ:g} (default 10)"
    )
    p.add_argument("--seed", type=bounded(int, 0, 2**32 - 1, "an integer"), default=0)
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
        "--synthetic-input",
        action="store_true",
        help="train on the loader's first batch, kept on the device, every step: the device's own rate "
        "(docs/multi-rank.md)",
    )
    p.add_argument(
        "--price-per-hour",
        type=bounded(float, 0, 1e6, "a number"),
        metavar="P",
        help="price of the machine per hour: the report adds the cost per 1,000 samples and per epoch",
    )


def stem(scenario: str) -> str:
    """A scenario's name in a directory name: a .py file's stem, else the name itself."""
    return Path(scenario).stem if scenario.endswith(".py") else scenario


# The directories prepare_out created in this invocation (the topmost new one of each): an invocation that ends in
# exit 2 removes them again, so bad input found after the run directory was made leaves nothing behind.
_MADE: list[Path] = []


def prepare_out(out: str | None, default_name: str) -> Path:
    """The run (or sweep, tune) directory, created and checked writable; ``out`` None: a new
    runs/<default_name>-<time>[-N] (two runs started in the same second each get their own)."""
    from profiler.core.store import DB_NAME, RunDirBusy, claim_run_dir, make_dir

    claimed = None
    if out is None:
        out, claimed = _claim_default(default_name)
    path = Path(out)
    allowed = "allowed a directory that holds no run yet"
    if path.is_symlink() and not path.exists():
        raise BadInput(f"--out '{out}' is a dangling symlink (to '{os.readlink(path)}'): {allowed}")
    if path.exists() and not path.is_dir():
        raise BadInput(f"--out '{out}' is a file: {allowed}")
    if path.is_dir() and not os.access(path, os.R_OK | os.W_OK | os.X_OK):
        raise BadInput(f"--out '{out}' is not readable and writable by this user: {allowed}")
    new = claimed if claimed is not None else _topmost_missing(path)
    try:
        make_dir(path)
        if new is not None:
            _MADE.append(new)
        probe = path / ".stallscope-write-test"
        probe.write_text("")
        probe.unlink()
        claim_run_dir(path)  # held until this process exits: a second run on the same directory is refused
    except RunDirBusy as exc:
        raise BadInput(f"--out '{out}' is in use by {_who(exc.pid)}: choose another directory") from None
    except OSError as exc:
        discard_made()
        raise BadInput(f"--out '{out}' is not writable: {exc.strerror or exc}") from None
    if (path / DB_NAME).exists():
        raise BadInput(f"--out '{out}' already holds a run: choose a new directory")
    return path


def _claim_default(default_name: str) -> tuple[str, Path | None]:
    """A default run directory no other run has: created here (mkdir fails for a name taken, even by a run started
    at the same moment); the topmost directory this made, for discard_made."""
    from profiler.core.store import make_dir, no_world_write

    base = os.path.join("runs", f"{default_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    for k in range(1, 1000):
        cand = Path(base if k == 1 else f"{base}-{k}")
        top = _topmost_missing(cand)
        try:
            make_dir(cand.parent)
            cand.mkdir()
        except FileExistsError:
            continue
        except OSError as exc:
            raise BadInput(f"--out '{cand}' (the default) is not writable: {exc.strerror or exc}") from None
        no_world_write(cand)
        return str(cand), top
    raise BadInput(f"--out: 999 runs named '{base}' already exist: pass --out DIR")


def _topmost_missing(path: Path) -> Path | None:
    missing = None
    for p in (path, *path.parents):
        if p.exists() or p.is_symlink():
            break
        missing = p
    return missing


def keep_made(path: Path) -> None:
    """``path`` holds recorded steps: an exit 2 keeps it (and the directories above it)."""
    resolved = path.resolve()
    _MADE[:] = [m for m in _MADE if m.resolve() != resolved and m.resolve() not in resolved.parents]


def discard_made() -> None:
    """Remove what prepare_out created in this invocation (it ends in exit 2: bad input writes nothing)."""
    while _MADE:
        shutil.rmtree(_MADE.pop(), ignore_errors=True)


def forget_made() -> None:
    """A new invocation: what an earlier one (in this process) created is no longer this one's to remove."""
    _MADE.clear()


def _who(pid: int | None) -> str:
    return f"a live run (pid {pid})" if pid is not None else "another live run"


@dataclass(frozen=True, slots=True)
class Training:
    """What ``run``, ``sweep`` and ``tune`` resolved from their shared flags, before any run directory exists."""

    scenario: Scenario
    device: DeviceInfo
    data: Path | None
    extra_meta: dict[str, Any]
    warmup: int  # --warmup, else the scenario's: resolved here once for the run config and the live view


def resolve_training(
    args: argparse.Namespace, pipeline_names: Sequence[str] = (), flag: str = "--pipeline"
) -> Training:
    """Check the shared flags (BadInput naming the value) and make the scenario's default data if it needs it.
    Each of ``pipeline_names`` (given with ``flag``) must be able to train the scenario here: checked before a
    run directory is made, so a pipeline that does not apply is one line and no run."""
    import pipelines
    import scenarios
    from profiler.core.steps.device_timers import resolve_device

    args.scenario = DEFAULT_SCENARIO if args.scenario is None else args.scenario  # "" is an unknown name
    try:  # the checks that import nothing first: a bad name is one line at once, not after torch's import
        for name in pipeline_names:  # an unknown name raises naming the allowed ones
            pipelines.check(name)
        asks_torch = str(args.device).startswith(("auto", "cuda"))
        device = None if asks_torch else resolve_device(args.device)
        scenario = scenarios.get(args.scenario)
        scenario.model_factory(args.model)
        if device is None:
            device = resolve_device(args.device)
        if device.sim is not None and getattr(args, "precision", "default") != "default":
            device = resolve_device(_sim_precision(args, device))
    except ValueError as exc:  # ScenarioError, PipelineError, DeviceError, or an unknown --model
        raise BadInput(str(exc)) from None
    try:
        pipelines.require(pipeline_names, scenario.data, scenario.name)
    except pipelines.PipelineError as exc:
        raise BadInput(f"{flag}: {exc}") from None
    data, count = None, None
    if scenario.data is None:
        if args.data is not None:
            raise BadInput(f"--data {args.data!r}: scenario {scenario.name!r} generates its data in memory")
    elif args.data is not None:
        data = Path(args.data)
        if not data.is_dir():
            what = "does not exist" if not data.exists() else "is not a directory"
            raise BadInput(f"--data {args.data!r} {what}: allowed an existing data directory")
    else:
        data = default_data(scenario, count := synthetic_images(args, scenario))
    meta: dict[str, Any] = {}
    if count is not None:
        meta["synthetic_images"] = count  # whatif renders the same batch again (the directory is gone by then)
    if args.scenario.endswith(".py"):  # a run names its scenario; `whatif` rebuilds a file's from this path
        meta["scenario_source"] = str(Path(args.scenario).resolve())
    if args.price_per_hour is not None:
        meta["price_per_hour"] = args.price_per_hour
    return Training(scenario, device, data, meta, scenario.warmup if args.warmup is None else args.warmup)


def _sim_precision(args: argparse.Namespace, device: DeviceInfo) -> str:
    """``--device sim:...`` with ``--precision`` in it: the twin of a real run changes only ``--device``."""
    from profiler.drivers.precision import Precision, PrecisionError

    spec = device.sim.spec
    try:
        return Precision(args.precision).sim_device(str(args.device), spec.name, spec.peak_tflops)
    except PrecisionError as exc:
        raise BadInput(str(exc)) from None


def loader_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """``RunConfig``'s prefetch_factor and pin_memory from --prefetch-factor / --pin-memory."""
    pin = getattr(args, "pin_memory", None)
    prefetch = getattr(args, "prefetch_factor", None)
    return {"prefetch_factor": prefetch, "pin_memory": None if pin is None else pin == "on"}


def base_run_config(args: argparse.Namespace, t: Training, out: Path) -> RunConfig:
    """What ``run``, ``sweep`` and ``tune`` configure alike from their shared flags; each replaces the rest."""
    from profiler.drivers.runner import RunConfig

    return RunConfig(
        out=out,
        device=t.device,
        warmup=t.warmup,
        sample_hz=args.sample_hz,
        seed=args.seed,
        data=t.data,
        on_bad_sample=args.on_bad_sample,
        model=args.model,
        synthetic_input=args.synthetic_input,
        extra_meta=t.extra_meta,
        precision=precision_of(args, t),
    )


def precision_of(args: argparse.Namespace, t: Training) -> Precision:
    """--precision / --channels-last, checked against the device: one line and exit 2 where it cannot run them."""
    from profiler.drivers.precision import Precision, PrecisionError

    p = Precision(args.precision, args.channels_last)
    try:
        if t.device.kind == "cuda":
            import torch

            p.check("cuda", torch)
        else:
            p.check(t.device.kind)
    except PrecisionError as exc:
        raise BadInput(str(exc)) from None
    return p


def default_data(scenario: Scenario, count: int | None = None) -> Path:
    """The scenario's default data set (a file-backed scenario's: ``scenario.data`` set), generated (once)
    behind a progress bar; with ``count`` (:func:`synthetic_images`: --synthetic-input), that many images in a
    temporary directory removed at exit, the one batch the run reads: no data set is kept for it."""
    from profiler.render.progress import progress
    from scenarios.datagen import DataError, ensure_default, temporary

    try:
        if count is not None:
            what = f"one batch of {scenario.data} images ({count}) for --synthetic-input, removed at exit"
            with progress(f"stallscope: generating {what}") as report:
                return temporary(str(scenario.data), count, seed=0, progress=report)
        what = f"the default {scenario.data} set ({scenario.data_count} images, once)"
        with progress(f"stallscope: generating {what}") as report:
            return ensure_default(str(scenario.data), scenario.data_count, seed=0, progress=report)
    except DataError as exc:
        raise BadInput(str(exc)) from None


SYNTHETIC_MIN_IMAGES = 10  # the imagenet-like set's classes: one image of each at least


def synthetic_images(args: argparse.Namespace, scenario: Scenario) -> int | None:
    """With --synthetic-input, the images the default data set needs: one batch for each rank, at the largest batch
    and rank count the command may run (a run trains on its loader's first batch alone: issue #57 found the full
    1,280-image set generated, 21 s on a new machine, for one batch); None without it (the scenario's whole set)."""
    if not getattr(args, "synthetic_input", False):
        return None
    given = getattr(args, "batch_size", None)  # run's --batch-size; sweep's --batch-sizes; tune's --max-batch-size
    batches = [given] if isinstance(given, int) else list(getattr(args, "batch_sizes", None) or [scenario.batch_size])
    if hasattr(args, "max_workers"):  # a tune climbs the batch up to its ceiling
        batches.append(getattr(args, "max_batch_size", None) or MAX_BATCH_FACTOR * scenario.batch_size)
    nproc = getattr(args, "nproc", None)
    ranks = max(nproc) if isinstance(nproc, list) and nproc else nproc if isinstance(nproc, int) else 1
    need = max(b for b in batches if isinstance(b, int)) * max(1, ranks)
    return min(scenario.data_count, max(SYNTHETIC_MIN_IMAGES, need))


def print_summary(summary: Summary, as_json: bool, job: ZeroCodeJob | None = None) -> None:
    """The report on stdout (or the summary JSON alone with ``--json``); ``job``: a zero-code job's ranks,
    whose keys join the JSON and whose table follows the report."""
    if as_json:
        print(json.dumps(job.summary_dict(summary) if job else summary.to_dict(), indent=2))
        return
    from profiler.render.report import make_console, render_report

    console = make_console()
    render_report(summary, console)
    if job is not None:
        from profiler.render.sampled import render_job

        render_job(job, console)


def load_job_summary(dirs: list[str], baseline: str | None = None) -> tuple[JobSummary, JobInput]:
    """The JobSummary of the job in ``dirs`` (its nodes' directories) and the job as read; BadInput naming what is
    wrong."""
    from profiler.jobs.analysis import summarize_job
    from profiler.jobs.jobdir import JobDirError, load_job

    try:
        job = load_job(dirs, baseline)
    except JobDirError as exc:
        raise BadInput(str(exc)) from None
    return summarize_job(job), job


def print_job(job_summary: JobSummary, as_json: bool) -> None:
    """The job report on stdout (or the job summary JSON alone with ``--json``)."""
    if as_json:
        print(json.dumps(job_summary.to_dict(), indent=2))
        return
    from profiler.jobs.render import render_job
    from profiler.render.report import make_console

    render_job(job_summary, make_console())


def report_outcome(
    summary: Summary | None, run_dir: Path, as_json: bool, code: int, job: ZeroCodeJob | None = None
) -> int:
    """Print the Summary a run built at close; ``code`` stays the exit code. Without one (it could not be
    built: the error was logged), say where the store is."""
    if summary is None:
        from profiler.core.store import DB_NAME

        if (run_dir / DB_NAME).exists():
            say(f"no summary could be built; the run store is kept: stallscope report {run_dir}")
        else:
            say("nothing was recorded: the run stopped before its store was created")
        return code if code != EXIT_OK else EXIT_FAILED
    print_summary(summary, as_json, job)
    return code


def endpoint_arg(text: str) -> Endpoint:
    """argparse type of ``--prometheus [ADDR:]PORT``."""
    from profiler.export.endpoint import parse_endpoint

    try:
        return parse_endpoint(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_prometheus_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prometheus",
        type=endpoint_arg,
        metavar="[ADDR:]PORT",
        help="serve the live figures as Prometheus metrics at http://ADDR:PORT/metrics (ADDR default 127.0.0.1; "
        "needs stallscope[prometheus]; docs/integrations.md)",
    )


def exporter_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[PrometheusExporter | None]:
    """The started Prometheus exporter of ``--prometheus`` (closed when the block ends), or None without it.
    Started here, before any run directory: a port in use or a missing package is one line and exit 2."""
    endpoint = getattr(args, "prometheus", None)
    if endpoint is None:
        return contextlib.nullcontext()
    from profiler.export.prometheus import ExporterError, PrometheusExporter

    try:  # bound here; it answers scrapes from where the run's figures are (the sampler process, or this one)
        exporter = PrometheusExporter(endpoint).bind()
    except ExporterError as exc:
        raise BadInput(str(exc)) from None
    say(f"Prometheus metrics at {exporter.url}")
    return _serving(exporter)


@contextlib.contextmanager
def _serving(exporter: PrometheusExporter) -> Iterator[PrometheusExporter]:
    try:
        yield exporter
    finally:
        exporter.close()
        if exporter.error is not None:  # the run went on; the endpoint kept its last figures meanwhile
            err = exporter.error
            say(
                f"the Prometheus endpoint could not read the run's figures (its last ones stayed served): "
                f"{type(err).__name__}: {err}"
            )


def follow_store(
    exporter: PrometheusExporter | None, path: str | Path, *, job: bool = False
) -> contextlib.AbstractContextManager[object]:
    """``--prometheus``: the exporter follows the run (``job``: the multi-rank job) stored at ``path`` on a store
    tail of its own (a tail hands each row once, so it cannot share the live view's); nothing without one."""
    if exporter is None:
        return contextlib.nullcontext()
    from profiler.live.feeds import JobFeed, StoreFeed

    return exporter.follow_job(JobFeed(path)) if job else exporter.follow(StoreFeed(path))


def live_monitor(
    no_live: bool,
    total_steps: int | None = None,
    exporter: PrometheusExporter | None = None,
    own_feed: Callable[[], LiveFeed] | None = None,
) -> RunViews | None:
    """The live view of a run (None with ``--no-live`` and no exporter); ``total_steps`` None: open-ended. With
    ``exporter``, the exporter follows the run too: on the same feed, or on ``own_feed()`` for a feed that hands
    each row once (a store tail: two readers of one tail would each see part of the run)."""
    if no_live and exporter is None:
        return None
    return RunViews(not no_live, total_steps, exporter, own_feed)


@dataclass(frozen=True)
class RunViews:
    """A run's views: served from its sampler process where it has one (:meth:`recipes`, docs/architecture.md
    "Two processes"), else from this process over a feed (calling it)."""

    live: bool
    total_steps: int | None
    exporter: PrometheusExporter | None
    own_feed: Callable[[], LiveFeed] | None

    def recipes(self) -> list[ViewRecipe]:
        out = []
        if self.live:
            tty = sys.stderr.isatty()
            out.append(ViewRecipe("profiler.live.render:monitor_for", tty=tty, total_steps=self.total_steps))
        if self.exporter is not None:
            out.append(self.exporter.recipe())
        return out

    @contextlib.contextmanager
    def __call__(self, feed: LiveFeed) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if self.exporter is not None:
                stack.enter_context(self.exporter.follow(self.own_feed() if self.own_feed else feed))
            if self.live:
                from profiler.live.render import monitor_for

                stack.enter_context(monitor_for(feed, total_steps=self.total_steps))
            yield
