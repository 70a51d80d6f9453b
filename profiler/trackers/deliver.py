"""Calls into a tracker from a thread of its own, so that a tracker that fails or blocks costs the run nothing.

:class:`Delivery` opens its tracker on its thread (the library's import and the server's answer included) and
makes each call there, in order. The caller only queues: :meth:`Delivery.submit` never waits (a full queue drops
the call and counts it), :meth:`Delivery.close` waits a bounded time.

Invariants:
- An error (the open, or any call) is said once per tracker, as one warning naming the tracker and the error.
  After a call that failed the later ones still run (a server back up takes the next points); after an open
  that failed they are skipped.
- A tracker still blocked at close is left behind on its daemon thread, said once; the close returns in
  ``wait_s`` whatever the tracker does.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable

from profiler.trackers.base import Tracker

log = logging.getLogger("stallscope")

Call = Callable[[Tracker], None]
MAX_QUEUED = 64  # calls waiting for a blocked tracker; more are dropped (one call carries a whole interval)
_STOP = object()


class Delivery:
    def __init__(self, name: str, opener: Callable[[], Tracker], *, max_queued: int = MAX_QUEUED) -> None:
        self.name = name
        self._opener = opener
        self._q: queue.Queue[object] = queue.Queue(max_queued)
        self.dropped = 0
        self.errors = 0
        self.done = 0  # calls made (successfully or not)
        self._said = False
        self._thread = threading.Thread(target=self._run, name=f"stallscope-{name}", daemon=True)
        self._thread.start()

    def submit(self, call: Call) -> bool:
        """Queue ``call`` (never waits); False when the queue is full and it was dropped."""
        try:
            self._q.put_nowait(call)
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def close(self, wait_s: float) -> bool:
        """Close the tracker after what is queued; True when that was done within ``wait_s``."""
        with contextlib.suppress(queue.Full):  # a queue still full of calls for a blocked tracker: left behind
            self._q.put(_STOP, timeout=wait_s)
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self._said = True  # what it may say later is left unsaid: one warning per tracker
            log.warning(
                "stallscope: tracker %s: still writing after %.3g s at the run's close; left behind (%d calls done, "
                "%d dropped)",
                self.name,
                wait_s,
                self.done,
                self.dropped,
            )
            return False
        return True

    def _warn(self, what: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._said:
            self._said = True
            log.warning(
                "stallscope: tracker %s: %s failed: %s: %s; the run goes on without it",
                self.name,
                what,
                type(exc).__name__,
                exc,
            )

    def _run(self) -> None:
        try:
            tracker: Tracker | None = self._opener()
        except Exception as exc:  # noqa: BLE001 - a tracker is not the run: said once, its calls then skipped
            self._warn("opening it", exc)
            tracker = None
        while True:
            call = self._q.get()
            if call is _STOP:
                break
            if tracker is not None:
                try:
                    call(tracker)  # type: ignore[operator]
                except Exception as exc:  # noqa: BLE001 - as above: said once, the run goes on
                    self._warn("writing", exc)
            self.done += 1
        if tracker is not None:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                self._warn("closing it", exc)
