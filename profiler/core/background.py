"""A thread beside a block: :func:`in_background` runs ``body(done)`` on a daemon thread while the block runs.

The live trackers' fold (``profiler.trackers.live``, ``joblive``), their sampler-process view (``view``) and the
Prometheus exporter's refresh each follow a feed this way.

Invariants:
- At the block's exit ``done`` is set and the thread joined for at most ``join_s``: a body still busy then (a
  feed read that hangs) is left behind, a daemon, and the caller's exit never waits longer.
- The body notices the stop within one of its waits: it loops on ``done.wait(period)`` (or waits on ``done``), so
  every blocking call it makes has a timeout (STYLE.md, 5).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def in_background(body: Callable[[threading.Event], object], *, name: str, join_s: float) -> Iterator[threading.Event]:
    """``body(done)`` on a thread named ``name`` while the block runs; ``done`` set and the thread joined (at most
    ``join_s``) at its exit, whatever ended the block."""
    done = threading.Event()
    thread = threading.Thread(target=body, args=(done,), name=name, daemon=True)
    thread.start()
    try:
        yield done
    finally:
        done.set()
        thread.join(join_s)
