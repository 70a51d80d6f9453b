"""The run store: one SQLite file per run, written off the training thread, readable after any crash.

docs/store.md, "Durability", details each invariant:
- WAL mode, ``synchronous=NORMAL``: a process killed at any instant leaves a sound file with every commit.
- Only the writer thread touches the write connection; producers' ``put_*`` only append to a queue.
- Every ``flush_s`` (<= 1 s) the writer commits all that is queued and refreshes ``meta.heartbeat``.
- Schema changes are additive (``meta.schema_version``); a store from a newer stallscope is refused.
- A failed write, or a removed run directory, stops the writer for good: committed rows stay, the store is
  marked ``failed`` where the disk allows, and ``on_error`` is told once.
- One writer per run directory (a ``lockf`` lock on ``.stallscope.lock``); the world-write bit is always cleared.
"""

from __future__ import annotations

from profiler.core.rows import PhaseRow, RunRecord, StepRow
from profiler.core.store.lock import (
    RunDirBusy,
    claim_run_dir,
    lock_run_dir,
    make_dir,
    no_world_write,
    pid_alive,
    unlock_run_dir,
)
from profiler.core.store.reader import (
    StoreTail,
    integrity_ok,
    load_run,
    load_sparse,
    read_head,
    read_meta,
    read_rows,
    read_stacks,
    resolve_db,
    run_status,
)
from profiler.core.store.schema import (
    DB_NAME,
    ERROR_NAME,
    LOCK_NAME,
    PHASE_COLS,
    READ_TIMEOUT_S,
    SCHEMA_VERSION,
    STACKS_NAME,
    STACKS_NAMES,
    STALE_HEARTBEAT_S,
    STEP_COLS,
    StoreBusy,
    StoreError,
)
from profiler.core.store.writer import RunStore, StoreWriteError, write_failure

__all__ = [
    "DB_NAME",
    "ERROR_NAME",
    "LOCK_NAME",
    "PHASE_COLS",
    "READ_TIMEOUT_S",
    "SCHEMA_VERSION",
    "STACKS_NAME",
    "STACKS_NAMES",
    "STALE_HEARTBEAT_S",
    "STEP_COLS",
    "PhaseRow",
    "RunDirBusy",
    "RunRecord",
    "RunStore",
    "StepRow",
    "StoreBusy",
    "StoreError",
    "StoreTail",
    "StoreWriteError",
    "claim_run_dir",
    "integrity_ok",
    "load_run",
    "load_sparse",
    "lock_run_dir",
    "make_dir",
    "no_world_write",
    "pid_alive",
    "read_head",
    "read_meta",
    "read_rows",
    "read_stacks",
    "resolve_db",
    "run_status",
    "unlock_run_dir",
    "write_failure",
]
