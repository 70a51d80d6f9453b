"""``stallscope report`` on a sweep or tune directory: the table ``sweep`` or ``tune`` printed, rebuilt from the
directory's ``sweep.json`` / ``tune.json``, also when the command was stopped part-way (its finished rows and
the configuration the signal stopped, "interrupted") or killed (a tune's table as far as it got)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from profiler.cli.common import EXIT_OK, BadInput

if TYPE_CHECKING:
    from profiler.sweep.analysis import SweepResult
    from profiler.sweep.tuner import TuneResult


def table_file(path: str) -> Path | None:
    """``DIR/sweep.json`` or ``DIR/tune.json`` when ``path`` is a sweep or tune directory (not a run's), else None."""
    d = Path(path)
    if not d.is_dir() or (d / "run.sqlite").exists():
        return None
    return next((f for f in (d / "sweep.json", d / "tune.json") if f.is_file()), None)


def report_table(table: Path, args: argparse.Namespace) -> int:
    """``stallscope report`` on a sweep or tune directory: the table the command printed, from its JSON, also
    when the sweep or tune was stopped part-way (the rows that finished, the stopped one "interrupted")."""
    for flag in ("html", "trace", "baseline"):
        if getattr(args, flag, None) is not None:
            raise BadInput(f"--{flag}: allowed with a run or job directory; for one configuration of {table.parent}: "
                           f"stallscope report {table.parent}/<config> --{flag} ...")  # fmt: skip
    try:
        doc = json.loads(table.read_text())
        result = _table_result(table.name, doc)
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
        raise BadInput(f"'{table}' is not a readable {table.stem} table: {type(exc).__name__}: {exc}") from None
    if args.json:
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    from profiler.render.report import make_console
    from profiler.sweep.render import render_sweep, render_tune
    from profiler.sweep.tuner import TuneResult

    if isinstance(result, TuneResult):  # a tune that finished (or was stopped): its own table
        render_tune(result, make_console(), table.parent)
    else:
        render_sweep(result, make_console(), table.parent)
    return EXIT_OK


def _table_result(name: str, doc: dict[str, Any]) -> SweepResult | TuneResult:
    """The SweepResult or TuneResult of a table's JSON. A tune that never finished (killed: its ``tune.json``
    still says "running") shows as the table of the trials that did."""
    from profiler.sweep.analysis import analyse_sweep, row_from_dict, sweep_from_dict
    from profiler.sweep.tuner import tune_from_dict

    if name == "sweep.json":
        return sweep_from_dict(doc)
    if doc.get("status") != "running":
        return tune_from_dict(doc)
    rows = [row_from_dict(r) for r in doc["runs"]]
    scenario, device = str(doc.get("scenario", "?")), str(doc.get("device", "?"))
    return analyse_sweep(rows, scenario=f"{scenario} (tune, unfinished)", device=device, planned=len(rows),
                         status="interrupted")  # fmt: skip
