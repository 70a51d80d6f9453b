"""Moving the ring's records into the run store: the sampler process does it every ``DRAIN_S``; the training
process does it once a second after taking the store over from a sampler process that died.

The ring carries step events (:mod:`profiler.core.stepevents`); the drain's :class:`Assembler` makes the rows.

Invariant: each drain ends with a ring mark (:meth:`RunStore.put_mark`): ``[position, resume, step]``, the
position read up to, and where the oldest step not yet in the store began (its first event's position and its
index). The store commits the rows with it; the ring's read position then moves to ``resume``, so a reader that
takes over reads that step's events again (and skips the items before ``position``, applied already).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from profiler.core.kerneltrace import fill
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sampler_process.ring import RingReader
from profiler.core.sampler_process.views import SamplerFeed
from profiler.core.stepevents import Assembler
from profiler.core.store import RunStore

DRAIN_S = 0.1  # the sampler process moves the ring's records to the store this often


class Extras(Protocol):
    """What only a sampler process does with an item (rescan its sources, run py-spy); a no-op elsewhere."""

    def rescan_soon(self) -> None: ...

    def read_memory_soon(self) -> None: ...

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
        self,
        reader: RingReader,
        store: RunStore,
        extras: Extras | None = None,
        feed: SamplerFeed | None = None,
        assembler: Assembler | None = None,
    ) -> None:
        """``feed``: the views' feed (the sampler process's, when it serves any), handed each step and meta item;
        ``assembler``: makes the rows of the ring's step events (its run's zero and warm-up steps)."""
        self.reader = reader
        self.store = store
        self.assembler = assembler if assembler is not None else Assembler(0.0, 0)
        self.assembler.names = reader.names  # the names announced in the ring, as they pass
        self._extras = extras
        self._feed = feed
        self._handlers: dict[str, Callable[[Any], None]] = {
            "meta": self._meta,
            "event": lambda v: store.put_event(v[0], v[1], v[3], v[2]),
            "samples": lambda v: store.put_samples(tuple(r) for r in v),
            "rescan": lambda _v: extras.rescan_soon() if extras is not None else None,
            "memory": lambda _v: extras.read_memory_soon() if extras is not None else None,
            "pyspy": self._pyspy,
        }
        self.steps = 0

    def once(self) -> Closing | None:
        """Every record up to the producer's write position now, then a mark; the close item if it came."""
        closing = None
        store, asm = self.store, self.assembler
        apply = asm.apply
        for kind, value in self.reader.records():
            if kind == "event":
                apply(*value)
            else:
                closing = self._item(value) or closing
        if closing is not None:
            asm.finish()
        for row, phases in asm.take():
            self._step(row, phases)
        for taken in asm.take_windows():
            window = fill(taken, store.run_dir, asm.t0)  # a window handed over as kineto's trace: read here
            store.put_window(window)
            if self._feed is not None:
                self._feed.add_window(window)
        pos = self.reader.pos
        if store.failure is not None:  # nothing commits any more: the ring's room is not held for it
            self.reader.ring.set_read(pos)
        else:
            resume, index = asm.resume or (pos, asm.next_step)
            store.put_mark([pos, resume, index])
        return closing

    def _step(self, row: StepRow, phases: list[PhaseRow]) -> None:
        self.store.put_step(row, phases)
        self.steps += 1
        if self._feed is not None:
            self._feed.add_step(row, phases)

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
