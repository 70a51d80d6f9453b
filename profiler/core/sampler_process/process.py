"""The sampler process: started by the training process's
:class:`~profiler.core.sampler_process.client.ProcessRecorder`, it does everything a run records except timing the
steps (docs/architecture.md, "Two processes").

It reads its orders as one JSON line on stdin, maps the ring the training process made, builds its sources
from their recipes, and then, until the close item arrives or the training process is gone:
- samples every source on absolute deadlines, and runs py-spy when asked
  (:class:`~profiler.core.sampling.sampler_and_pyspy.Watchers`: the :class:`~profiler.core.sampling.sampler.Sampler`,
  its threads here);
- every ``DRAIN_S`` moves the ring's records into the run store it writes (the training process holds the
  run directory's lock; this process is its one writer), marking the ring position each commit reaches;
- serves the run's views (the live view, the Prometheus endpoint: :mod:`profiler.core.sampler_process.views`)
  from the rows it drains.

Invariants:
- It says ``ready`` on its channel (stdout, a pipe) once its sources are open (the training process waits for
  that, as it waited for its own sampler's probes before); its warnings follow on the same channel, and the
  training process logs them as its own.
- It never stops the training: it ignores SIGINT and SIGTERM (they are the training process's to handle; it
  closes when that process tells it, or is gone) and runs ``NICE`` steps below the training process.
- The training process killed (SIGKILL included), or its Session dropped unclosed: seen within ``DRAIN_S`` (its
  parent pid changes, or the stdin pipe it holds closes); the ring is drained (every segment it grew by: they
  come over a socket whose queue outlives the sender) and the store closed ``interrupted``, saying so, with the
  count of steps taken from the ring's header (meta ``steps_taken``); then, with nobody waiting for it, the
  ``on_orphaned`` recipe of its orders (the report cache, from the layers above) is called with the run directory.
- A store that stops writing: the failure goes to the ring's header, where the training process reads it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import pickle
import select
import signal
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from profiler.core.recorders.in_thread import checked_store_errors, log_warning, store_failed_line
from profiler.core.sampler_process.drain import DRAIN_S, Drain
from profiler.core.sampler_process.ring import Announced, Ring, RingReader
from profiler.core.sampler_process.views import SamplerFeed, close_views, open_views
from profiler.core.sampler_process.wire import Close, Final, Line, Log, Ready, line
from profiler.core.sampling.sampler import SourceHealth
from profiler.core.sampling.sampler_and_pyspy import Watchers
from profiler.core.sources.base import Source, SourceRecipe
from profiler.core.steps.events import Assembler
from profiler.core.store import RunStore, StoreWriteError

_CHANNEL = 1  # the pipe the training process reads: "ready", then its warnings (JSON lines)
NICE = 5  # below the training process: it gets a core first; at +5 this process still gets ~1/4 of a busy one


def orphaned_error(parent: int) -> str:
    return f"the training process (pid {parent}) ended without closing the run (killed?)"


def build_sources(recipes: list[dict[str, Any]]) -> list[Source]:
    return [src for r in recipes for src in SourceRecipe(r["factory"], **r["kwargs"]).build()]


def run(orders: dict[str, Any]) -> int:
    parent = int(orders["parent_pid"])
    ring = Ring(int(orders["fd"]), int(orders["size"]), create=False)
    run_dir = Path(orders["run_dir"])
    store_errors = checked_store_errors(str(orders["store_errors"]))

    def failed(failure: StoreWriteError) -> None:  # the store's writer thread, once: the training process reads it
        ring.set_failure(str(failure), failure.last_kept)
        if store_errors == "warn":
            log_warning(store_failed_line(failure))

    # the store the training process created (it holds the run directory's lock): this process is its one writer
    store = RunStore(run_dir, meta={"sampler_pid": os.getpid()}, lock=False, on_error=failed,
                     on_commit=ring.committed)  # fmt: skip
    watch = Watchers(store, sample_hz=float(orders["sample_hz"]), sources=build_sources(orders["recipes"]),
                     t0=float(orders["t0"]), warn=log_warning)  # fmt: skip
    views = orders.get("views") or []
    feed = SamplerFeed(orders.get("meta") or {}, lambda: list(watch.sampler.buffer)) if views else None
    # the ring's later segments arrive over this socket, each before the NEXT record that names it
    segments = Announced(ring, socket.socket(fileno=int(orders["segments_fd"])))
    reader = RingReader(ring, segments=segments)
    drain = Drain(reader, store, watch, feed, Assembler(float(orders["t0"]), int(orders["warmup"])))
    # the sources' probes (NVML's init can take seconds) go on beside the first drains: the ring waits for none
    watch.start()
    shown = open_views(views, feed) if feed is not None else None
    _ready()
    closing, orphaned = _follow(drain, parent)
    if feed is not None and shown is not None:  # the views' last figures carry the run's status; then they close
        feed.set_status(closing.status)
        close_views(shown)
    # the steps the training process took (the ring's header): beside those stored, what a kill cost (if anything)
    store.put_meta(sampler_process={"pid": os.getpid(), "steps": drain.steps}, steps_taken=ring.taken())
    for name, health in closing.local_sources.items():  # the training process's own (in-process) sources
        watch.sampler.stats.sources.setdefault(name, SourceHealth(**health))
    watch.close()
    store.put_meta(status=closing.status, error=closing.error, ended_at=time.time())
    store.close()
    if store.failure is not None:  # its rows, read through this process's connection: the file may be gone
        _hand_over_rows(store)
    segments.left(reader.seg)
    ring.close()
    if orphaned and store.failure is None:
        after_orphaned(orders.get("on_orphaned"), run_dir)
    return 0


def after_orphaned(recipe: dict[str, Any] | None, run_dir: Path) -> None:
    """The training process is gone and the store closed: call ``recipe`` (``package.module:function``, from the
    layers above: the report cache) with the run directory. Nobody waits for this process any more, so the
    user's first ``report`` of a killed run reads the cache instead of every row (docs/store.md)."""
    if not recipe:
        return
    module, _, name = str(recipe["factory"]).partition(":")
    try:
        getattr(importlib.import_module(module), name)(str(run_dir), **recipe.get("kwargs", {}))
    except Exception as exc:  # noqa: BLE001 - the store is closed and whole: a report reads its rows instead
        logging.getLogger("stallscope").warning("the report cache of %s was not written: %s", run_dir, exc)


def _hand_over_rows(store: RunStore) -> None:
    """The rows of a store that stopped writing, pickled to a file the training process reads (``Final``)."""
    fd, path = tempfile.mkstemp(prefix="stallscope-final-", suffix=".pickle")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(store.record(), f)
    except OSError:  # no room for it either (the disk, the file size limit): the summary reads the store
        os.unlink(path)
    else:
        _say(Final(path))


def _ready() -> None:
    """Tell the training process that the sources are open and the first reading is under way."""
    _say(Ready())


def _say(said: Line) -> None:
    """One line to the training process (this process's stdout is a pipe it reads)."""
    with contextlib.suppress(OSError):
        os.write(_CHANNEL, line(said))


class _Relay(logging.Handler):
    """This process's warnings go to the training process, which logs them as its own (its logging setup applies)."""

    def emit(self, record: logging.LogRecord) -> None:
        _say(Log(record.levelno, record.getMessage()))


def _gone(parent: int) -> bool:
    """The training process ended (this process's parent changed), or dropped its end of our stdin (its Session was
    collected without a close: the pipe closes with it)."""
    if os.getppid() != parent:
        return True
    return bool(select.select([0], [], [], 0)[0]) and not os.read(0, 1)


def _follow(drain: Drain, parent: int) -> tuple[Close, bool]:
    """Drain until the close item comes, or the training process is gone (then one last drain); (the close,
    whether the training process is gone without one)."""
    while True:
        gone = _gone(parent)
        closing = drain.once()
        if closing is not None:
            return closing, False
        if gone:
            return Close("interrupted", orphaned_error(parent), {}), True
        time.sleep(DRAIN_S)


def _line(fd: int) -> bytes:
    """One line from ``fd``, read a byte at a time: nothing after it is buffered away from the EOF check."""
    got = b""
    while not got.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b:
            break
        got += b
    return got


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.nice(NICE)
    orders = json.loads(_line(0))
    # the channel to the training process is fd 1 as started; anything else that prints gets /dev/null there
    global _CHANNEL  # noqa: PLW0603 - one channel per process, set once here
    _CHANNEL = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    log = logging.getLogger("stallscope")
    log.addHandler(_Relay())
    log.setLevel(int(orders.get("log_level", logging.WARNING)))
    log.propagate = False
    return run(orders)
