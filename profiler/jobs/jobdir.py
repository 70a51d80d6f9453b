"""Reading a multi-rank job back from its directories: ``job.json``, ``node-K/`` and ``rank-R/`` stores.

A job directory is what ``stallscope run SCENARIO --nproc N`` writes (docs/multi-rank.md): the launcher's
``job.json``, one node sampler store ``node-K/`` and one ordinary run store ``rank-R/`` per rank on that node.
Several nodes each write one; :func:`load_job` merges them (same ``job_id`` required).

Invariants:
- Bad input raises :class:`JobDirError` with one line naming the directory and what is allowed (the CLI prints it
  and exits 2). A rank whose store is missing or unreadable is not bad input: the job is reported with that
  rank's row saying so (a rank killed with SIGKILL leaves a store without summary.json, read like any other).
- Reads only; the figures are computed by :func:`profiler.jobs.analysis.summarize_job`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

from profiler.analysis.meta import JSON, as_list
from profiler.core.store import DB_NAME, RunRecord, StoreError, load_run
from profiler.jobs.analysis import BaselineInput, JobInput, NodeInput, RankInput

JOB_FILE = "job.json"
_RANK_DIR = re.compile(r"rank-(\d+)")
_NODE_DIR = re.compile(r"node-(\d+)")


class JobDirError(ValueError):
    """A job directory that cannot be reported: the message is one line naming it."""


def is_job_dir(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a job directory: it holds ``job.json`` or ``rank-R/`` directories (and no run.sqlite)."""
    p = Path(path)
    if not p.is_dir() or (p / DB_NAME).exists():
        return False
    return (p / JOB_FILE).is_file() or any(_RANK_DIR.fullmatch(c.name) and c.is_dir() for c in p.iterdir())


def read_job_json(path: str | os.PathLike[str]) -> JSON:
    """The launcher's record in ``path`` ({} when there is none); JobDirError when it is not a JSON object."""
    f = Path(path) / JOB_FILE
    if not f.exists():
        return {}
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise JobDirError(f"'{f}' is not readable JSON ({exc}): allowed the job.json a job run writes") from None
    if not isinstance(doc, dict):
        raise JobDirError(f"'{f}' is not a JSON object: allowed the job.json a job run writes")
    return doc


def _numbered(path: Path, pattern: re.Pattern[str]) -> dict[int, Path]:
    return {int(m[1]): c for c in sorted(path.iterdir()) if (m := pattern.fullmatch(c.name)) and c.is_dir()}


def _load(path: Path) -> tuple[RunRecord | None, str | None]:
    try:
        return load_run(path), None
    except StoreError as exc:
        return None, str(exc)


def _node(path: Path, job: JSON) -> NodeInput:
    nodes = _numbered(path, _NODE_DIR)
    want = job.get("node_rank")
    chosen = nodes.get(want) if isinstance(want, int) else next(iter(nodes.values()), None)
    record = _load(chosen)[0] if chosen is not None else None
    return NodeInput(str(path), job, record)


def _check_same_job(dirs: Sequence[Path], jobs: Sequence[JSON]) -> None:
    seen: tuple[Path, object] | None = None
    for d, job in zip(dirs, jobs, strict=True):
        jid = job.get("job_id")
        if jid is None:
            continue
        if seen is not None and jid != seen[1]:
            raise JobDirError(
                f"'{seen[0]}' is job '{seen[1]}' but '{d}' is job '{jid}': report merges the node directories "
                "of one job only"
            )
        seen = seen or (d, jid)


def _ranks(dirs: Sequence[Path], jobs: Sequence[JSON]) -> list[RankInput]:
    found: dict[int, RankInput] = {}
    where: dict[int, Path] = {}
    for d, job in zip(dirs, jobs, strict=True):
        node_rank = v if isinstance(v := job.get("node_rank"), int) else None
        stores = _numbered(d, _RANK_DIR)
        listed = [r for r in as_list(job.get("ranks")) if isinstance(r, int)]
        for rank in sorted(set(stores) | set(listed)):
            if rank in found:
                raise JobDirError(f"rank {rank} is in both '{where[rank]}' and '{d}': allowed each rank in one node")
            where[rank] = d
            path = stores.get(rank, d / f"rank-{rank}")
            if rank not in stores:
                found[rank] = RankInput(rank, node_rank, str(path), None, f"no store: '{path}' does not exist")
                continue
            record, problem = _load(path)
            meta_node = record.meta.get("node_rank") if record is not None else None
            found[rank] = RankInput(rank, node_rank if node_rank is not None else meta_node, str(path), record, problem)
    return [found[r] for r in sorted(found)]


def load_job(
    dirs: Sequence[str | os.PathLike[str]],
    baseline: str | os.PathLike[str] | None = None,
    *,
    with_baseline: bool = True,
) -> JobInput:
    """Read the job written into ``dirs`` (one per node); ``baseline`` (``--baseline``) overrides job.json's;
    ``with_baseline`` False reads no baseline at all (a baseline job's own is not needed)."""
    paths = [Path(d) for d in dirs]
    for p in paths:
        if not p.is_dir():
            raise JobDirError(f"job directory '{p}' does not exist")
        if not is_job_dir(p):
            raise JobDirError(
                f"'{p}' is not a job directory (no {JOB_FILE}, no rank-R/): allowed the directories of one job's nodes"
            )
    jobs = [read_job_json(p) for p in paths]
    _check_same_job(paths, jobs)
    ranks = _ranks(paths, jobs)
    if not ranks:
        raise JobDirError(f"'{paths[0]}' holds no rank-R/ store and its {JOB_FILE} lists no ranks")
    notes: list[str] = []
    base = _baseline(baseline, paths, jobs, notes) if with_baseline else None
    return JobInput(tuple(_node(p, j) for p, j in zip(paths, jobs, strict=True)), tuple(ranks), base, tuple(notes))


def _baseline(
    given: str | os.PathLike[str] | None, dirs: Sequence[Path], jobs: Sequence[JSON], notes: list[str]
) -> BaselineInput | None:
    """``--baseline`` (bad input when it cannot be read), else job.json's ``baseline`` (a note when it cannot)."""
    if given is not None:
        try:
            return read_baseline(Path(given))
        except (JobDirError, StoreError) as exc:
            raise JobDirError(f"--baseline '{given}': {exc}") from None
    for d, job in zip(dirs, jobs, strict=True):
        recorded = job.get("baseline")
        if not isinstance(recorded, str) or not recorded:
            continue
        path = Path(recorded)
        if not path.exists() and not path.is_absolute():
            path = d / recorded
        try:
            return read_baseline(path)
        except (JobDirError, StoreError) as exc:
            notes.append(f"the baseline in {JOB_FILE}, '{recorded}', cannot be read ({exc}): no scaling efficiency")
            return None
    return None


def read_baseline(path: Path) -> BaselineInput:
    """A single run (its store) or a job (e.g. its ``--nproc 1`` run) to measure scaling against."""
    if is_job_dir(path):
        return BaselineInput(str(path), job=load_job([path], with_baseline=False))
    return BaselineInput(str(path), record=load_run(path))
