"""The run store's file layout: names, the SQLite schema and its versions, and the readers' errors."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 4  # 2 added phases.runq_s, steps.data_wait_runq_s and steps.runq_s; 3 the kernel windows;
# 4 kernel_windows.recorded_end
STALE_HEARTBEAT_S = 10.0  # the writer commits (and refreshes the heartbeat) at least every second
DB_NAME = "run.sqlite"
STACKS_NAME = "pyspy.speedscope.json"  # written by py-spy beside the store; read with it
STACKS_NAMES = (STACKS_NAME, "pyspy.txt")  # speedscope (ordered samples) or raw collapsed stacks
ERROR_NAME = "store-error.txt"  # why the writer stopped, when the store itself had no room left to say it
LOCK_NAME = ".stallscope.lock"  # held (lockf) by the process writing the run directory
READ_TIMEOUT_S = 3.0  # a reader waits this long for a lock (WAL readers are not blocked by the writer's commits)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
    step INTEGER PRIMARY KEY,
    t_start REAL NOT NULL,        -- s since run start: the loop asked for this step's batch
    t_end REAL NOT NULL,          -- s since run start: the loop asked for the next batch
    data_wait_s REAL NOT NULL,    -- host time blocked in next() on the loader
    samples INTEGER,              -- items in the batch (NULL: unknown)
    warmup INTEGER NOT NULL,      -- 1 for warm-up steps, excluded from the summary
    data_wait_runq_s REAL,        -- v2: training thread's run-queue wait inside next() (NULL: not measured)
    runq_s REAL                   -- v2: training thread's run-queue wait over the whole step
);
CREATE TABLE IF NOT EXISTS phases (
    step INTEGER NOT NULL,
    name TEXT NOT NULL,           -- "h2d", "compute", or a user name; nested phases as "outer/inner"
    depth INTEGER NOT NULL,       -- 0 for top-level phases (only those enter the breakdown)
    t_start REAL NOT NULL,        -- host perf_counter, s since run start
    t_end REAL NOT NULL,
    dev_start REAL,               -- device (CUDA event) time on the same timeline; NULL on CPU
    dev_end REAL,
    runq_s REAL                   -- v2: training thread's run-queue wait inside the phase (schedstat)
);
CREATE INDEX IF NOT EXISTS phases_step ON phases(step);
CREATE TABLE IF NOT EXISTS samples (
    t REAL NOT NULL,              -- s since run start, when the reading was taken
    source TEXT NOT NULL,         -- "host", "nvml", "sampler"
    metric TEXT NOT NULL,
    value REAL                    -- NULL: the metric could not be read at this instant
);
CREATE INDEX IF NOT EXISTS samples_metric ON samples(metric, t);
CREATE TABLE IF NOT EXISTS kernel_windows (  -- v3: profiler.core.kernel_windows.windows
    window INTEGER PRIMARY KEY,
    t_start REAL NOT NULL,        -- s since run start: its opening began (the recorder's start)
    t_end REAL NOT NULL,          -- s since run start: its closing ended (activities read and handed on)
    cost_s REAL NOT NULL,         -- the training thread's time opening and closing it
    recorded_end REAL             -- v4: where its recorded steps ended, its stop running on after (NULL: t_end)
);
CREATE TABLE IF NOT EXISTS kernels (  -- v3: the device's activity in each window
    window INTEGER NOT NULL,
    stream INTEGER NOT NULL,
    kind INTEGER NOT NULL,        -- 0 kernel, 1 copy, 2 set
    t_start REAL NOT NULL,        -- s since run start, on the device, put on the host's clock
    t_end REAL NOT NULL,
    t_launch REAL                 -- the host call that launched it (NULL: not known)
);
CREATE TABLE IF NOT EXISTS events (
    t REAL NOT NULL,
    kind TEXT NOT NULL,           -- "source", "source_error", "status", "warning", "error"
    source TEXT,
    message TEXT NOT NULL
);
"""


STEP_COLS = "step, t_start, t_end, data_wait_s, samples, warmup, data_wait_runq_s, runq_s"
PHASE_COLS = "step, name, depth, t_start, t_end, dev_start, dev_end, runq_s"
# columns each schema version added: absent from an older store, they read as NULL
ADDED = {"steps": ("data_wait_runq_s", "runq_s"), "phases": ("runq_s",), "kernel_windows": ("recorded_end",)}
WINDOW_COLS = "window, t_start, t_end, cost_s, recorded_end"


class StoreError(Exception):
    """The run store is missing, unreadable or not a stallscope store."""


class StoreBusy(StoreError):
    """The run store is locked by another process past :data:`READ_TIMEOUT_S` (a writer holding it exclusively)."""


def add_columns(con: sqlite3.Connection) -> None:
    """Bring an older store in the same directory up to this schema (additive: new columns are NULL)."""
    for table, cols in ADDED.items():
        have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        for col in cols:
            if col not in have:
                con.execute(f"ALTER TABLE {table} ADD COLUMN {col} REAL")


def select_cols(con: sqlite3.Connection, table: str) -> str:
    """The select list for ``table`` in StepRow / PhaseRow / KernelWindow field order; columns an older store lacks
    read NULL."""
    have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
    wanted = {"steps": STEP_COLS, "phases": PHASE_COLS, "kernel_windows": WINDOW_COLS}[table].split(", ")
    return ", ".join(c if c in have or c not in ADDED[table] else f"NULL AS {c}" for c in wanted)
