"""SIGINT/SIGTERM as :class:`~profiler.core.session.Interrupted` in the main thread while a run trains, so that its
Session closes the store "interrupted"; the previous handlers are put back when the block ends."""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


class SignalStop:
    """Turns SIGINT/SIGTERM into ``Interrupted(signal name)`` inside the block; ``received``: the first one's name.

    ``defer_first`` (sweep, tune): the first signal only records its name in ``received``: the configuration in
    flight stops at its next measured step (the stop rule polls ``received``) and no further one starts, so the
    signal never lands inside library code (a DataLoader's ``__del__``, a source probe) that would print or
    swallow an exception raised there. A second signal raises at once, for a step that never ends.
    ``ignore_more`` (a rank of a job): the first signal raises and every later one is ignored, so that the
    store's close is not cut short by the next signal of the same stop (Ctrl-C reaches the whole group)."""

    def __init__(self, defer_first: bool = False, ignore_more: bool = False) -> None:
        self.defer_first = defer_first
        self.ignore_more = ignore_more
        self.received: str | None = None
        self._old: dict[signal.Signals, _Handler] = {}
        self._interrupted: type[BaseException] = BaseException

    def __enter__(self) -> SignalStop:
        from profiler.core.session import Interrupted  # here, not in the handler: no import inside a signal

        self._interrupted = Interrupted
        self._old = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is None:
            self.received = name
            if self.defer_first:
                return
        if self.ignore_more:
            for s in STOP_SIGNALS:
                signal.signal(s, signal.SIG_IGN)
        raise self._interrupted(name)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)
