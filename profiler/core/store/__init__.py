"""The run store: one SQLite file per run, written off the training thread, readable after any crash.

Invariants:
- The file is opened in WAL mode with ``synchronous=NORMAL``: a process killed at any instant (SIGKILL
  included) leaves a database that passes ``PRAGMA integrity_check`` and holds every transaction committed
  before the kill. Power loss is out of scope.
- Only the writer thread touches the write connection. Producers (the training thread, the sampler)
  call ``put_*`` which only appends to a queue: a few hundred nanoseconds, never a disk write.
- The writer wakes every ``flush_s`` (<= 1 s), writes everything queued in one transaction and commits, so
  a crash loses at most that much. ``meta.heartbeat`` is refreshed at each commit; a run whose status is still
  ``running`` but whose pid is gone, or whose heartbeat is stale, was interrupted.
- Schema changes are additive; ``meta.schema_version`` says which tables and columns exist. A store from a newer
  stallscope (a higher version) is refused by the readers rather than misread.
- A write that fails (disk full, over quota, the file size limit, the directory removed) stops the writer for
  good: what was committed stays committed (the failed transaction is rolled back), the store is marked
  ``status: failed`` with the reason where the disk still takes that much, and ``on_error`` is told once.
  Each flush checks that ``run.sqlite`` is still the file it writes: a removed run directory is a failure,
  not a silent write into an unlinked inode.
- One writer per run directory: a ``.stallscope.lock`` file holding a POSIX lock (``lockf``) while a store or a
  CLI run owns the directory; the kernel drops it with the process, so a stale lock never blocks a new run.
- Files and directories are created with the user's umask, except that the world-write bit is always cleared.
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
