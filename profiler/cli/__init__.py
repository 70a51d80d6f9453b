"""The ``stallscope`` command line: argument parsing, one call into a package, rendering and exit codes.

One module per group of commands, each exporting ``add_parsers(subparsers)`` and ``HANDLERS`` (command name
-> handler): ``run`` (run, run -- CMD, attach), ``report`` (report, compare, watch, scenarios), ``sweep``
(sweep, tune), ``data``, ``whatif``, ``kernels``. What they share is ``common``. A group imports ``common`` and its
own helper module (``job``: run's ``--nproc``; ``tables``: report on a sweep or tune directory), never another
group or this package; nothing outside ``profiler.cli`` imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from profiler.cli import data, kernels, report, run, sweep, whatif
from profiler.cli.common import EXIT_BAD_INPUT, BadInput, Handler, Parser, discard_made, forget_made, say

_GROUPS = (run, report, data, sweep, whatif, kernels)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="stallscope", description="Is the accelerator waiting for data, and what would fix it?")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in _GROUPS:
        group.add_parsers(sub)
    return p


def handlers() -> dict[str, Handler]:
    return {name: fn for group in _GROUPS for name, fn in group.HANDLERS.items()}


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        # a path that is not UTF-8 (undecodable bytes arrive as surrogates) is printed escaped, never a traceback
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    args_in, command = run.split_command(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(args_in)
    forget_made()
    try:
        if command is not None:
            run.check_command(args, command)
        code = handlers()[args.command](args)
    except BadInput as exc:
        say(f"error: {exc}")
        code = EXIT_BAD_INPUT
    except BrokenPipeError:  # its reader went away (`stallscope kernels T | head`): nothing left to say to it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's flush does not fail again
        return 1
    if code == EXIT_BAD_INPUT:
        discard_made()  # bad input leaves no half-made run directory behind
    return code


__all__ = ["build_parser", "main"]
