"""The sampler process's view of :class:`profiler.trackers.live.TrackerHook` (``log_view``), opened before that
process says it is ready: it imports nothing of the analysis here, so that the Session's start does not wait for
it. A thread imports :mod:`profiler.trackers.live` and follows the feed until the view closes."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from profiler.core.background import in_background

JOIN_S = 10.0  # the close: the trackers' own wait (live.CLOSE_WAIT_S) and the last fold, with room


@contextlib.contextmanager
def log_view(
    feed: Any, *, targets: list[dict[str, Any]], every_s: float, run_name: str | None = None
) -> Iterator[None]:
    def run(done: threading.Event) -> None:
        from profiler.trackers.live import follow_targets

        with follow_targets(feed, targets, every_s=every_s, run_name=run_name):
            done.wait()

    with in_background(run, name="stallscope-trackers-view", join_s=JOIN_S):
        yield None
