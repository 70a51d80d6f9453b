"""``stallscope whatif RUN_DIR``: argument parsing, one call into ``profiler.whatif.run``, rendering and exit
codes: 0 ok, 2 bad input, 1 when a ``--check`` run failed for another reason than a predicted OOM."""

from __future__ import annotations

import argparse
import json
import re
from typing import Any

from profiler.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    MAX_BATCH,
    MAX_WORKERS,
    BadInput,
    Handler,
    bounded,
    exit_signal,
    int_list,
    say,
)
from profiler.whatif.source import DEFAULT_TARGETS

MAX_REPEAT = 20
MAX_HOST_CORES = 4096
_DEVICE_START = re.compile(r"^(sim:|cpu$|cuda|auto$)")


def device_list(text: str) -> list[str]:
    """``sim:v100,precision=amp,sim:h100`` -> ["sim:v100,precision=amp", "sim:h100"]: an item that does not
    start a device is an option of the one before it."""
    out: list[str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            raise argparse.ArgumentTypeError(f"{text!r} has an empty item: allowed sim:NAME[,OPTION=V][,sim:NAME...]")
        if _DEVICE_START.match(item) or not out:
            out.append(item)
        else:
            out[-1] += f",{item}"
    return out


def add_parsers(sub: Any) -> None:
    """Register ``whatif``."""
    w = sub.add_parser(
        "whatif",
        help="predict throughput, stall and device use on other (simulated) devices, worker counts and batch "
        "sizes from one measured run",
    )
    w.add_argument("run_dir", help="a run directory (any device: cpu or sim:NAME)")
    w.add_argument(
        "--device",
        type=device_list,
        action="extend",
        metavar="sim:NAME[,...]",
        help="comma-separated simulated devices, options after each (default: the run's own if simulated, else "
        f"{','.join(DEFAULT_TARGETS)})",
    )
    w.add_argument(
        "--workers", type=int_list(0, MAX_WORKERS), metavar="W,W,...", help="worker counts (default the run's)"
    )
    w.add_argument(
        "--batch-size", type=int_list(1, MAX_BATCH), metavar="B,B,...", help="batch sizes (default the run's)"
    )
    _add_check_options(w)
    w.add_argument(
        "--worker-gap",
        choices=("measure", "off"),
        default="measure",
        help="measure how much more a sample costs a worker process than the main process on the run's dataset, "
        "and how much the usable cores' worth of workers deliver together, and apply them where a prediction moves "
        "the loading between them or changes how many workers load (default); off: assume the same cost and that "
        "each worker adds a whole one",
    )
    _add_storage_options(w)
    w.add_argument(
        "--host-cores",
        type=bounded(int, 1, MAX_HOST_CORES, "an integer"),
        metavar="N",
        help="predict for a host of N cores that nothing else uses (the loader's measured cost per sample kept; "
        "default: this run's host, its usable cores less what other processes took)",
    )
    _add_ray_options(w)
    w.add_argument("--json", action="store_true", help='print only {"predictions": [...], ...} on stdout')


def dir_list(text: str) -> tuple[str, ...]:
    """``--ray-run``'s comma-separated run directories (each read, and its errors named, by the what-if)."""
    items = tuple(t.strip() for t in text.split(","))
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item: allowed a comma-separated list of run directories"
        )
    return items


def _add_ray_options(w: Any) -> None:
    """``--ray-cpus N,...`` and the ray run whose Ray figures they add (``--ray-run``)."""
    w.add_argument(
        "--ray-cpus",
        type=int_list(1, MAX_WORKERS),
        metavar="N,N,...",
        help="also predict the run's loading moved to Ray Data map_batches tasks on N remote CPUs of this host's "
        "speed (--check: a local Ray instance of N CPUs on this host)",
    )
    w.add_argument(
        "--ray-run",
        type=dir_list,
        metavar="DIR[,DIR...]",
        help="runs of the same scenario and batch size on --pipeline ray, one per Ray CPU count (--workers): Ray's "
        "own per-batch cost (its map tasks beyond the loader, the trainer's hand-off, its workers' hold on a CPU) is "
        "taken from the run of N CPUs for a prediction at N, else from the nearest count (default: the base's, when "
        "it ran on ray; else not included, said so)",
    )


def _add_check_options(w: Any) -> None:
    """``--check`` and how it measures: ``--repeat``, ``--steps``, ``--warmup``."""
    w.add_argument(
        "--check",
        action="store_true",
        help="also train each configuration on its simulated device (the run's steps and warm-up) into "
        "RUN_DIR/whatif/<label>/ and print predicted against measured",
    )
    w.add_argument(
        "--repeat",
        type=bounded(int, 1, MAX_REPEAT, "an integer"),
        default=1,
        metavar="N",
        help="with --check: measure each configuration N times; the median throughput is the measured figure and "
        "the spread (min-max) is shown beside it (default 1)",
    )
    w.add_argument(
        "--steps",
        type=bounded(int, 1, None, "an integer"),
        metavar="N",
        help="with --check: measured steps of each check run (default the run's)",
    )
    w.add_argument(
        "--warmup",
        type=bounded(int, 0, None, "an integer"),
        metavar="N",
        help="with --check: warm-up steps of each check run (default the run's)",
    )


def _add_storage_options(w: Any) -> None:
    """Where the predictions' bytes come from: ``--cached`` or ``--storage-mbps N``."""
    store = w.add_mutually_exclusive_group()
    store.add_argument(
        "--cached",
        action="store_true",
        help="predict with the data set in the page cache: the loader's measured wait for storage removed "
        "(--check: checked on a warm page cache)",
    )
    store.add_argument(
        "--storage-mbps",
        type=bounded(float, 0.001, 1e6, "a number"),
        metavar="MB/S",
        help="predict with the data set on a store of this many MB/s serving one read at a time (--check: the "
        "reads paced so, run --store-mbps)",
    )


def cmd_whatif(args: argparse.Namespace) -> int:
    from profiler.whatif.check import CheckPlan, CheckStopped
    from profiler.whatif.model import Storage, WhatIfError
    from profiler.whatif.run import Request, run_whatif

    request = Request(
        run_dir=args.run_dir,
        devices=args.device,
        workers=args.workers,
        batch_sizes=args.batch_size,
        worker_gap=args.worker_gap,
        storage=Storage(cached=args.cached, mbps=args.storage_mbps),
        host_cores=args.host_cores,
        ray_cpus=args.ray_cpus,
        ray_runs=args.ray_run or (),
        check=args.check,
        plan=CheckPlan(repeat=args.repeat, steps=args.steps, warmup=args.warmup),
    )
    try:
        outcome = run_whatif(request, say)
    except WhatIfError as exc:
        raise BadInput(str(exc)) from None
    except CheckStopped as exc:
        say(f"stopped by {exc.signame}")
        raise SystemExit(exit_signal(exc.signame)) from None
    if args.json:
        print(json.dumps(outcome.to_dict(), indent=2))
    else:
        from profiler.render.report import make_console
        from profiler.whatif.render import render_whatif

        render_whatif(outcome.result, make_console(), outcome.confidence)
    return EXIT_FAILED if outcome.check_failed else EXIT_OK


HANDLERS: dict[str, Handler] = {"whatif": cmd_whatif}
