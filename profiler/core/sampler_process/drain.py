"""Moving the ring's records into the run store: the sampler process does it every ``DRAIN_S``; the training
process does it once a second after taking the store over from a sampler process that died.

The ring carries step events (:mod:`profiler.core.steps.events`); the drain's :class:`Assembler` makes the rows.

Invariant: each drain ends with a ring mark (:meth:`RunStore.put_mark`): ``[position, resume, step]``, the
position read up to, and where the oldest step not yet in the store began (its first event's position and its
index). The store commits the rows with it; the ring's read position then moves to ``resume``, so a reader that
takes over reads that step's events again (and skips the items before ``position``, applied already).
"""

from __future__ import annotations

from typing import Protocol

from profiler.core.kernel_windows.trace_file import fill
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sampler_process.ring import RingReader
from profiler.core.sampler_process.views import SamplerFeed
from profiler.core.sampler_process.wire import Close, Item, Meta, PySpy, ReadMemory, Rescan, RunEvent, Samples
from profiler.core.sources.memory import Taken
from profiler.core.steps.events import Assembler
from profiler.core.store import RunStore

DRAIN_S = 0.1  # the sampler process moves the ring's records to the store this often


class Extras(Protocol):
    """What only a sampler process does with an item (rescan its sources, run py-spy); a no-op elsewhere."""

    def rescan_soon(self) -> None: ...

    def read_memory_soon(self, taken: Taken | None = None, t: float = 0.0) -> None: ...

    def start_pyspy(self, pid: int, *, rate: int, attach_timeout_s: float, unavailable: str) -> str | None: ...


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
        self.steps = 0

    def once(self) -> Close | None:
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

    def _item(self, item: Item) -> Close | None:
        """One item applied to the store (or asked of the sampler process); the close item returned."""
        store, extras = self.store, self._extras
        if isinstance(item, Close):
            return item
        if isinstance(item, Meta):
            store.put_meta(**item.items)
            if self._feed is not None:
                self._feed.add_meta(item.items)
        elif isinstance(item, RunEvent):
            store.put_event(item.t, item.kind, item.message, item.source)
        elif isinstance(item, Samples):
            store.put_samples(tuple(r) for r in item.rows)
        elif extras is None:  # an ask only a sampler process answers
            return None
        elif isinstance(item, Rescan):
            extras.rescan_soon()
        elif isinstance(item, ReadMemory):
            extras.read_memory_soon(item.taken or None, item.t)
        elif isinstance(item, PySpy):
            extras.start_pyspy(item.pid, rate=item.rate, attach_timeout_s=item.attach_timeout_s,
                               unavailable=item.unavailable)  # fmt: skip
        return None
