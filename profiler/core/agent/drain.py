"""Moving the ring's records into the run store: the sampler process does it every ``DRAIN_S``; the training
process does it once a second after taking the store over from a sampler process that died.

Invariant: each drain ends with a ring mark (:meth:`RunStore.put_mark`), so the store commits the rows with the
position they came up to, and the ring's read position moves only after that commit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from profiler.core.agent.ring import RingReader
from profiler.core.agent.views import AgentFeed
from profiler.core.store import RunStore

DRAIN_S = 0.1  # the sampler process moves the ring's records to the store this often


class Extras(Protocol):
    """What only a sampler process does with an item (rescan its sources, run py-spy); a no-op elsewhere."""

    def rescan_soon(self) -> None: ...

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None: ...


@dataclass(slots=True)
class Closing:
    """The training process's close item: the run's status and what stopped it, and its own sampler's health."""

    status: str
    error: str | None
    local_sources: dict[str, Any]


class Drain:
    """Applies each ring record to ``store``; :meth:`once` returns the close item once it has passed."""

    def __init__(
        self, reader: RingReader, store: RunStore, extras: Extras | None = None, feed: AgentFeed | None = None
    ) -> None:
        """``feed``: the views' feed (the sampler process's, when it serves any), handed each step and meta item."""
        self.reader = reader
        self.store = store
        self._extras = extras
        self._feed = feed
        self._handlers: dict[str, Callable[[Any], None]] = {
            "meta": self._meta,
            "event": lambda v: store.put_event(v[0], v[1], v[3], v[2]),
            "samples": lambda v: store.put_samples(tuple(r) for r in v),
            "rescan": lambda _v: extras.rescan_soon() if extras is not None else None,
            "pyspy": self._pyspy,
        }
        self.steps = 0

    def once(self) -> Closing | None:
        """Every record up to the producer's write position now, then a mark; the close item if it came."""
        closing = None
        store = self.store
        for kind, value in self.reader.records():
            if kind == "step":
                store.put_step(*value)
                self.steps += 1
                if self._feed is not None:
                    self._feed.add_step(*value)
            else:
                closing = self._item(value) or closing
        if store.failure is not None:  # nothing commits any more: the ring's room is not held for it
            self.reader.ring.set_read(self.reader.pos)
        else:
            store.put_mark(self.reader.pos)
        return closing

    def _item(self, item: Mapping[str, Any]) -> Closing | None:
        for key, value in item.items():
            if key == "close":
                return Closing(value["status"], value.get("error"), value.get("local_sources") or {})
            handler = self._handlers.get(key)
            if handler is not None:
                handler(value)
        return None

    def _meta(self, items: dict[str, Any]) -> None:
        self.store.put_meta(**items)
        if self._feed is not None:
            self._feed.add_meta(items)

    def _pyspy(self, args: Mapping[str, Any]) -> None:
        if self._extras is not None:
            self._extras.start_pyspy(
                int(args["pid"]),
                rate=int(args["rate"]),
                attach_timeout_s=float(args["attach_timeout_s"]),
                unavailable=str(args["unavailable"]),
            )
