"""The report cache: ``RUN_DIR/.stallscope-report.json``, the run's Summary and its plots' Timeline as they were
built when the run closed, so that ``report`` and ``report --html`` of a long run read one small file instead of
every row (docs/store.md, "The report cache").

Invariants:
- Written once, at close, beside ``summary.json`` and from the same Summary (atomically: a reader sees the old
  file, the new one or none).
- Read only when it is the store's own: the store's status is final (not running, not interrupted) and the same as
  the cached one, the run id and the number of steps match, the file is not older than the store, and it was
  written by today's analysis code (a fingerprint of its sources). Else it is ignored and the rows are read.
- What it returns equals what the rows give (:mod:`profiler.analysis.codec`'s round trip; tests check it), except
  that the Timeline holds no record: its ``steps`` (drawn by no report) are empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import profiler.analysis as analysis_package
from profiler.analysis import Summary
from profiler.analysis.codec import CodecError, allowed, decode, encode
from profiler.analysis.timeline import Timeline, build_timeline
from profiler.core.rows import RunRecord
from profiler.core.store import no_world_write, read_head, resolve_db, run_status

CACHE_NAME = ".stallscope-report.json"
FORMAT = 1


def fingerprint() -> str:
    """A hash of the analysis code (every module of ``profiler.analysis``) and of this file's format."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for path in sorted(Path(analysis_package.__file__).parent.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def write_cache(out_dir: Path, rec: RunRecord, summary: Summary) -> Path:
    """Build the run's Timeline and write it with ``summary``; OSError where the directory takes no file."""
    timeline = dataclasses.replace(build_timeline(rec), record=RunRecord(rec.meta, [], [], [], []))
    doc = {
        "format": FORMAT,
        "code": fingerprint(),
        "run_id": summary.run_id,
        "status": summary.status,
        "steps": len(rec.steps),
        "summary": encode(summary),
        "timeline": encode(timeline),
    }
    path = out_dir / CACHE_NAME
    tmp = out_dir / f"{CACHE_NAME}.{os.getpid()}.tmp"
    try:
        tmp.write_text(json.dumps(doc))
        no_world_write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


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
    status = meta.get("status")
    if status in (None, "running", "interrupted") or run_status(meta) != status:
        return None
    try:
        if not path.is_file() or path.stat().st_mtime < db.stat().st_mtime:
            return None
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    own = (doc.get("format"), doc.get("run_id"), doc.get("status"), doc.get("steps")) == (
        FORMAT, meta.get("run_id"), status, n_steps
    )  # fmt: skip
    return doc if own and doc.get("code") == fingerprint() else None
