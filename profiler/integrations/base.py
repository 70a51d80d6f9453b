"""What every trainer integration does the same way: where a rank's store goes, the Session's facts, the report.

Invariants:
- One training, one store: in a world of one the store is ``out_dir`` itself; rank R of a larger world writes
  ``out_dir/rank-R/`` with the multi-rank keys in its meta (docs/multi-rank.md), so ``stallscope report
  out_dir`` reads the ranks as one job and ``stallscope report out_dir/rank-R`` reads one alone.
- Closing never raises out of a framework's teardown: the store is the record, and the training's own outcome
  must not be hidden by the profiler's.
- A Prometheus endpoint that cannot be served when the training starts (its port in use) does not stop the
  training: one line on stderr, and the run is recorded as without it (meta ``prometheus``). What can be checked
  when the integration is made (the value, prometheus_client installed) raises there, before any training.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiler.analysis import Summary
from profiler.analysis.meta import opt_int
from profiler.core.session import LABELS
from profiler.export.endpoint import Endpoint, parse_endpoint
from profiler.runs.session import Session

log = logging.getLogger("stallscope")


def rank_dir(out_dir: str | os.PathLike[str], rank: int, world_size: int, run: int = 1) -> Path:
    """The store of ``rank``: ``out_dir`` in a world of one, ``out_dir/rank-R`` in a larger one. The ``run``-th
    training recorded by one profiler object (a second ``fit``) goes to ``out_dir-N`` instead, said once on the
    ``stallscope`` logger: two trainings in one store would mix their steps."""
    root = Path(out_dir)
    if run > 1:
        moved = root.with_name(f"{root.name}-{run}")
        if rank == 0:
            log.warning("stallscope: %s holds an earlier training; this one is recorded in %s", root, moved)
        root = moved
    return root / f"rank-{rank}" if world_size > 1 else root


def torch_device(device: object) -> str:
    """A Session device for the torch device a trainer computes on: CUDA ones as they are, any other ``cpu``."""
    text = str(device)
    return text if text.startswith("cuda") else "cpu"


def dist_meta(*, rank: int, world_size: int, local_rank: int, node_rank: int, nnodes: int) -> dict[str, int | str]:
    """The multi-rank keys a rank's store carries (as ``stallscope run --nproc`` writes them); none for one rank."""
    if world_size <= 1:
        return {}
    return {
        "rank": rank,
        "world_size": world_size,
        "local_rank": local_rank,
        "node_rank": node_rank,
        "nnodes": nnodes,
        "job_id": os.environ.get("TORCHELASTIC_RUN_ID", ""),
    }


def session_options(prometheus: str | int | None, session: Mapping[str, object]) -> dict[str, object]:
    """The user's Session arguments, ``prometheus`` checked now so that a bad one fails where the integration is
    made, before any training: a bad value is a ValueError, a missing ``prometheus_client`` an ImportError, one
    line each naming what is allowed or what to install."""
    if prometheus is not None:
        parse_endpoint(str(prometheus))
        if importlib.util.find_spec("prometheus_client") is None:
            from profiler.export.prometheus import INSTALL

            raise ImportError(f"prometheus={prometheus!r} needs the prometheus_client package: {INSTALL}")
    return {**session, "prometheus": prometheus}


def rank_endpoint(prometheus: str | int, local_rank: int) -> Endpoint:
    """Where a rank serves: PORT + local rank (one machine's ranks each listen on a port of their own; PORT 0
    stays 0, a free port each), on the address given."""
    at = parse_endpoint(str(prometheus))
    return Endpoint(at.host, at.port + local_rank if at.port else 0)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def start_session(out_dir: Path, options: Mapping[str, object], facts: Mapping[str, object]) -> Session:
    """A started Session on ``out_dir``: ``options`` are the user's Session arguments, ``facts`` what the trainer
    tells (device, labels, loader knobs, meta). The user's wins where both give one; the meta dicts merge.
    ``options["prometheus"]`` serves the run's figures while it trains (per rank: :func:`rank_endpoint`); the
    address is said on stderr, as ``stallscope run --prometheus`` says it."""
    meta = {**_mapping(facts.get("meta")), **_mapping(options.get("meta"))}
    args: dict[str, Any] = {k: v for k, v in facts.items() if k != "meta"}  # Session's arguments: it checks them
    args.update((k, v) for k, v in options.items() if k != "meta" and v is not None)
    meta.update((k, args.pop(k)) for k in LABELS if k in args)  # run facts: the Session keeps them in its meta
    if args.get("prometheus") is not None:
        args["prometheus"] = str(rank_endpoint(args["prometheus"], opt_int(meta.get("local_rank")) or 0))
    from profiler.export.prometheus import ExporterError

    try:
        session = Session(out_dir, **args, meta=meta).start()
    except ExporterError as exc:  # a port in use: known only now, in the framework's setup; the training goes on
        why = str(exc).replace("--prometheus ", "prometheus=", 1)
        sys.stderr.write(f"stallscope: {why}; training goes on, recorded in {out_dir} without the endpoint\n")
        sys.stderr.flush()
        args["prometheus"] = None
        session = Session(out_dir, **args, meta={**meta, "prometheus": f"not served: {why}"}).start()
    if session.exporter is not None:
        sys.stderr.write(f"stallscope: Prometheus metrics at {session.exporter.url}\n")
        sys.stderr.flush()
    return session


def print_report(summary: Summary | None, out_dir: Path) -> None:
    """The report of a run that ended, on stdout, as ``stallscope run`` prints it."""
    if summary is None:
        log.warning("stallscope: no summary for %s; `stallscope report %s` reads the store", out_dir, out_dir)
        return
    from profiler.render.report import make_console, render_report

    render_report(summary, make_console())
