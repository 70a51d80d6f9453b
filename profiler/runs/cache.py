"""The report cache: ``RUN_DIR/.stallscope-report.json``, the run's Summary and its plots' Timeline, so that
``report`` and ``report --html`` of a long run read one small file instead of every row (docs/store.md, "The report
cache").

Invariants:
- Written for a store that will not change again (:func:`settled`): at close, beside ``summary.json`` and from the
  same Summary; or by the first ``report`` of a run that was killed or interrupted, from the rows it read. Written
  atomically (a temporary file in the run directory, then ``os.replace``): a reader sees the old file, the new one
  or none, and a writer killed half-way leaves only its temporary file, which nothing reads.
- Read only when it is the store's own: no writer is live (the store is not ``running``), and the store is as it
  was when the cache was written: the same stored status, run id, number of steps and meta table (a digest of
  every key: a heartbeat, a status or a count written since changes it), no newer file (the cache is not older
  than ``run.sqlite`` nor than its WAL), and the cache was written by today's analysis code (a fingerprint of its
  sources). Else it is ignored and the rows are read.
- What it returns equals what the rows give (:mod:`profiler.analysis.codec`'s round trip; tests check it), except
  that the Timeline holds no record: its ``steps`` (drawn by no report) are empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import profiler.analysis as analysis_package
from profiler.analysis import Summary
from profiler.analysis.codec import CodecError, allowed, decode, encode
from profiler.analysis.timeline import Timeline, build_timeline
from profiler.core.rows import RunRecord
from profiler.core.store import STALE_HEARTBEAT_S, no_world_write, pid_alive, read_head, resolve_db, run_status

CACHE_NAME = ".stallscope-report.json"
FORMAT = 2  # 2: the meta table's digest, and caches of interrupted runs
FINAL = ("complete", "failed", "interrupted")  # statuses a writer stores as it closes the run

Meta = dict[str, Any]


def fingerprint() -> str:
    """A hash of the analysis code (every module of ``profiler.analysis``) and of this file's format."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for path in sorted(Path(analysis_package.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def meta_digest(meta: Meta) -> str:
    """A hash of the whole meta table as read (every key: a heartbeat or a status written since changes it)."""
    return hashlib.sha256(json.dumps(meta, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def settled(meta: Meta, now: float | None = None) -> bool:
    """Whether the store will not change again: its writer closed it with a final status, or it is still marked
    running but its writer is really gone (its pid has exited and its heartbeat is older than
    ``STALE_HEARTBEAT_S``: a killed training process's sampler may still be draining the last rows for a moment,
    with the training pid already gone)."""
    status = meta.get("status")
    if status in FINAL:
        return True
    if status != "running":
        return False
    now = time.time() if now is None else now
    beat = meta.get("heartbeat") or meta.get("started_at") or 0.0
    pid = meta.get("pid")
    stale = isinstance(beat, (int, float)) and now - beat > STALE_HEARTBEAT_S
    return stale and not (isinstance(pid, int) and pid_alive(pid))


def write_cache(out_dir: Path, rec: RunRecord, summary: Summary) -> Path | None:
    """Build the run's Timeline and write it with ``summary`` (at close); OSError where the directory takes no
    file. None where the store changed since ``rec`` was read."""
    timeline = build_timeline(rec)
    return store_cache(out_dir, summary, timeline, read=(rec.meta, len(rec.steps)))


def store_cache(
    run_dir: str | os.PathLike[str], summary: Summary, timeline: Timeline, *, read: tuple[Meta, int] | None = None
) -> Path | None:
    """Write ``summary`` and ``timeline`` as the run's cache, keyed by the store as it is now; ``read``: the meta
    and step count the caller read them from: where the store no longer has that many steps, or (for a meta read
    back from the store) another meta, nothing is written (None). OSError where the directory takes no file."""
    meta, n_steps = read_head(run_dir)
    if read is not None and (read[1] != n_steps or not _same_meta(read[0], meta)):
        return None
    doc = {
        "format": FORMAT,
        "code": fingerprint(),
        "run_id": meta.get("run_id"),
        "status": meta.get("status"),
        "steps": n_steps,
        "meta": meta_digest(meta),
        "summary": encode(summary),
        "timeline": encode(dataclasses.replace(timeline, record=RunRecord(timeline.record.meta, [], [], [], []))),
    }
    out_dir = resolve_db(run_dir).parent
    path = out_dir / CACHE_NAME
    tmp = out_dir / f"{CACHE_NAME}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(doc))
        no_world_write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _remove_left_behind(out_dir)
    return path


def _same_meta(read: Meta, now: Meta) -> bool:
    """``read`` (the caller's meta) is the store's meta now: the same table, or, for a record's meta kept in memory
    by its writer (values as put, not as read back), the same status and run id."""
    if meta_digest(read) == meta_digest(now):
        return True
    return all(read.get(k) == now.get(k) for k in ("status", "run_id")) and now.get("status") in FINAL


def _remove_left_behind(out_dir: Path) -> None:
    """Temporary files of writers that were killed before their rename (their pid is gone)."""
    for left in out_dir.glob(f"{CACHE_NAME}.*.tmp"):
        pid = left.name.removeprefix(f"{CACHE_NAME}.").removesuffix(".tmp")
        if pid.isdigit() and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                left.unlink()


def read_cache(run_dir: str | Path) -> tuple[Summary, Timeline] | None:
    """The run's cached (Summary, Timeline) when the cache is the store's own (see the module's invariants)."""
    doc = _own_doc(run_dir)
    if doc is None:
        return None
    try:
        summary = decode(doc["summary"], allowed(Summary))
        timeline = decode(doc["timeline"], allowed(Timeline))
    except (CodecError, KeyError, TypeError):
        return None
    if not isinstance(summary, Summary) or not isinstance(timeline, Timeline):
        return None
    return summary, timeline


def _own_doc(run_dir: str | Path) -> dict[str, object] | None:
    """The cache file's document when it is the store's own, else None."""
    meta, n_steps = read_head(run_dir)
    db = resolve_db(run_dir)
    path = db.parent / CACHE_NAME
    if meta.get("status") is None or run_status(meta) == "running":
        return None
    try:
        if not path.is_file() or path.stat().st_mtime_ns < _newest_ns(db):
            return None
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    own = (doc.get("format"), doc.get("run_id"), doc.get("status"), doc.get("steps"), doc.get("meta")) == (
        FORMAT, meta.get("run_id"), meta.get("status"), n_steps, meta_digest(meta)
    )  # fmt: skip
    return doc if own and doc.get("code") == fingerprint() else None


def _newest_ns(db: Path) -> int:
    """The newest modification time of the store's files (its WAL holds the commits not yet checkpointed)."""
    wal = db.with_name(db.name + "-wal")
    times = [db.stat().st_mtime_ns]
    with contextlib.suppress(FileNotFoundError):
        times.append(wal.stat().st_mtime_ns)
    return max(times)
