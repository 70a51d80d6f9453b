"""``stallscope data make``: parser and handler for the local data generators (nothing is downloaded)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from profiler.cli.common import EXIT_OK, BadInput, Handler, Parser, bounded


def add_parsers(sub: Any) -> None:
    """Register ``data`` and its ``make`` subcommand."""
    d = sub.add_parser("data", help="generate local data sets (never downloaded)")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=Parser)
    dm = dsub.add_parser("make", help="write a generated data set; a no-op on a complete directory")
    dm.add_argument("kind", help="imagenet-like (ImageFolder of JPEGs) | voc-like (detection JPEGs + COCO json)")
    dm.add_argument("--out", required=True, metavar="DIR")
    dm.add_argument("--count", type=bounded(int, 1, 10_000_000, "an integer"), required=True, metavar="N")
    dm.add_argument("--classes", type=bounded(int, 1, 100_000, "an integer"), default=10, metavar="K")
    dm.add_argument("--seed", type=bounded(int, 0, 2**32 - 1, "an integer"), default=0, metavar="S")
    dm.add_argument("--jobs", type=bounded(int, 1, 1024, "an integer"), help="processes (default: all cores)")


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
    elif info.generated < info.count:  # an earlier make was stopped or killed part-way (or files were removed)
        kept = info.count - info.generated
        print(f"stallscope: resumed {args.out}: wrote the {info.generated} missing {args.kind} images ({kept} were "
              f"already in place; {info.count} in the set)")  # fmt: skip
    else:
        print(f"stallscope: wrote {info.generated} {args.kind} images to {args.out} ({info.count} in the set)")
    return EXIT_OK


HANDLERS: dict[str, Handler] = {"data": cmd_data}
