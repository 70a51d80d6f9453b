"""The shared-memory ring between the training process (one producer side) and its sampler process (the consumer).

An anonymous memory file (``memfd``) mapped by both processes: a header, then a byte ring of records. The
training thread appends each step event (:mod:`profiler.core.stepevents`: a clock reading at a step or phase
boundary) to an array of doubles, one C call; every ``HANDOFF_STEPS`` steps or ``HANDOFF_S`` (the Session's tick),
and once a second from the watch thread, the array's bytes go into the ring as one record: no pickling, no system
call, no wake-up of any other thread; the sampler process makes the rows. Rare items (run facts, events, readings
of in-process sources, the close) travel as JSON records in the same ring, in the order they were put; the step
events in the order of the steps.

Invariants:
- Positions are byte counts since the ring was made (they never wrap; the offset is ``pos % size``). ``write`` is
  only advanced by the producer, after the record's bytes are in place; ``read`` only by the consumer, after the
  rows up to it are *committed* to the store (the store keeps that position as meta ``ring_pos`` in the same
  transaction), so a sampler process killed at any instant loses nothing: whoever writes the store next resumes
  from ``ring_pos``.
- A record never wraps: one that does not fit before the end is preceded by a pad record to the end. Every
  record starts 8-byte aligned, so a pad always fits.
- The ring never blocks the producer: a record that does not fit waits in the producer's spill list, in order,
  and goes in ahead of any later record once there is room (:meth:`RingWriter.flush`).
- The consumer's store failure (disk full, ...) is written to the header, so the training process can stop on
  it (``store_errors="raise"``) with one unpack per step.
"""

from __future__ import annotations

import mmap
import os
import resource
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from profiler.core.sampler_process.wire import (
    BLOB,
    EVENT_DOUBLES,
    EVENTS,
    EVENTS_PER_RECORD,
    NAME,
    PAD,
    Item,
    decode,
    encode,
)
from profiler.core.stepevents import Event

MAGIC = 0x53535247  # "SSRG"
VERSION = 2
HEADER = 4096  # the header's page; the ring's bytes follow
DEFAULT_SIZE = 8 << 20  # at a 2 ms step with 3 phases (~200 bytes a step), about 80 s of steps
# header fields: magic, version, size, write, read, failed, last_kept
_HEAD = struct.Struct("<IIQQQIxxxxq")
_W_OFF, _R_OFF, _FAIL_OFF, _KEPT_OFF = 16, 24, 32, 40
_MSG_OFF = 64  # the failure's message: u16 length, then UTF-8
_MSG_MAX = 2000
_POS = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_REC = struct.Struct("<IB")  # a record's length (with this head and padding) and kind
_EVENTS = struct.Struct("<IBxxx")  # a record of step events: its length and kind, then 5 doubles an event


class Ring:
    """The mapping of one ring's memory file, on either side."""

    def __init__(self, fd: int, size: int, *, create: bool) -> None:
        self.fd = fd
        self.size = size
        if create:
            os.ftruncate(fd, HEADER + size)
        # the producer maps it populated: a page first touched mid-run faults on the training thread (on a VM, tens
        # of microseconds a page: benchmarks/overhead.py)
        populate = getattr(mmap, "MAP_POPULATE", 0) if create else 0
        self.mem = mmap.mmap(fd, HEADER + size, flags=mmap.MAP_SHARED | populate)
        if hasattr(mmap, "MADV_DONTFORK"):
            self.mem.madvise(mmap.MADV_DONTFORK)  # a DataLoader's forked workers do not inherit it
        if create:
            _HEAD.pack_into(self.mem, 0, MAGIC, VERSION, size, 0, 0, 0, -1)
        else:
            magic, version, have, *_ = _HEAD.unpack_from(self.mem, 0)
            if magic != MAGIC or version != VERSION or have != size:
                raise ValueError(f"not a stallscope ring of {size} bytes (magic {magic:#x}, version {version})")
        self.view = memoryview(self.mem)

    @classmethod
    def create(cls, size: int = DEFAULT_SIZE) -> Ring:
        """A new ring in a new memory file; its ``fd`` is inheritable for the sampler process. The memory file
        counts against the file size limit (``ulimit -f``): under a lower one, the ring is made to fit it."""
        if size % 8 or size < 4096:
            raise ValueError(f"ring size {size}: allowed a multiple of 8 of at least 4096")
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            size = max(4096, min(size, (limit // 2 - HEADER) & ~4095))
        fd = os.memfd_create("stallscope-ring")  # close-on-exec: passed to the sampler process alone (pass_fds)
        return cls(fd, size, create=True)

    def read_pos(self) -> int:
        return int(_POS.unpack_from(self.mem, _R_OFF)[0])

    def write_pos(self) -> int:
        return int(_POS.unpack_from(self.mem, _W_OFF)[0])

    def set_read(self, pos: int) -> None:
        _POS.pack_into(self.mem, _R_OFF, pos)

    def committed(self, mark: list[int]) -> None:
        """The store committed a drain's mark (:mod:`profiler.core.sampler_process.drain`): the room before its resume
        position is free."""
        self.set_read(int(mark[1]))

    def set_failure(self, message: str, last_kept: int) -> None:
        """The consumer's store stopped writing: the message and the last step it kept, then the flag."""
        raw = message.encode()[:_MSG_MAX]
        struct.pack_into(f"<H{len(raw)}s", self.mem, _MSG_OFF, len(raw), raw)
        _I64.pack_into(self.mem, _KEPT_OFF, last_kept)
        _U32.pack_into(self.mem, _FAIL_OFF, 1)

    def failed(self) -> bool:
        return bool(_U32.unpack_from(self.mem, _FAIL_OFF)[0])

    def failure(self) -> tuple[str, int] | None:
        """(message, last step kept) once the consumer's store stopped writing, else None."""
        if not self.failed():
            return None
        (n,) = struct.unpack_from("<H", self.mem, _MSG_OFF)
        return bytes(self.mem[_MSG_OFF + 2 : _MSG_OFF + 2 + n]).decode(errors="replace"), int(
            _I64.unpack_from(self.mem, _KEPT_OFF)[0]
        )

    def close(self) -> None:
        self.view.release()
        self.mem.close()
        os.close(self.fd)


class RingWriter:
    """The training process's side: packs steps and JSON items into the ring (any thread, one lock)."""

    def __init__(self, ring: Ring) -> None:
        self._ring = ring
        self._view = ring.view
        self._size = ring.size
        self._w = ring.write_pos()
        # the step events not yet in the ring: the training thread's Session appends to it (``put``), one C call an
        # event, atomic under the GIL from any thread; flush_events() moves them in
        self.events = array("d")
        self.put: Callable[[Event], object] = self.events.extend
        self._lock = threading.Lock()
        self._names: dict[str, int] = {}
        self._spill: deque[bytes] = deque()
        self.spilled = 0  # records that waited in the spill list (the consumer was behind by a whole ring)

    def _name(self, name: str) -> int:
        """A phase name's id, announced in the ring before the first record that uses it."""
        ident = self._names[name] = len(self._names)
        if ident > 0xFFFF:
            raise ValueError(f"phase name {name!r}: a run has at most 65536 phase names")
        self._put(NAME, struct.pack("<H", ident) + name.encode())
        return ident

    def name_id(self, name: str) -> int:
        """The id of a phase name in this ring (announced once, before the first event that uses it)."""
        with self._lock:
            ident = self._names.get(name)
        return ident if ident is not None else self._name(name)

    def flush_events(self) -> None:
        """Move the step events appended so far into the ring (the training thread's tick, the watch thread, the
        close): as records of at most EVENTS_PER_RECORD events, in order, then the array drops what it moved (an
        event appended meanwhile by another thread stays for the next flush)."""
        events = self.events
        with self._lock:
            n = len(events)
            fit = (self._size // 2 - 8 - _EVENTS.size) // (8 * EVENT_DOUBLES)  # a record is at most half the ring
            step = min(EVENTS_PER_RECORD, fit) * EVENT_DOUBLES
            for at in range(0, n, step):
                data = events[at : min(n, at + step)].tobytes()
                self._put_locked(_EVENTS.pack(_EVENTS.size + len(data), EVENTS) + data)
            del events[:n]

    def put_item(self, item: Item) -> None:
        """A rare item (:mod:`profiler.core.sampler_process.wire`: run facts, a run event, readings, an ask, the
        close), in order with the steps."""
        self._put(BLOB, encode(item))

    def _put(self, kind: int, payload: bytes) -> None:
        n = _REC.size + len(payload)
        length = (n + 7) & ~7
        record = _REC.pack(length, kind) + payload + bytes(length - n)  # zeros to the next 8-byte boundary
        with self._lock:
            self._put_locked(record)

    def _put_locked(self, record: bytes) -> None:
        if len(record) + 8 > self._size // 2:
            raise ValueError(f"a ring record of {len(record)} bytes is over half the ring ({self._size} bytes)")
        if self._spill or not self._write(record):
            self._spill.append(record)
            self.spilled += 1
            self._flush()

    def flush(self) -> bool:
        """Move what spilled into the ring while there is room; True when nothing is left waiting."""
        with self._lock:
            return self._flush()

    def _flush(self) -> bool:
        spill = self._spill
        while spill and self._write(spill[0]):
            spill.popleft()
        return not spill

    def names(self) -> dict[int, str]:
        """The phase names announced so far, by id."""
        with self._lock:
            return {ident: name for name, ident in self._names.items()}

    def pending(self) -> int:
        """Records waiting in the spill list."""
        return len(self._spill)

    def _write(self, record: bytes) -> bool:
        """Copy ``record`` in at the write position (a pad first where it would cross the end); False when the
        ring has no room for it yet."""
        size, w = self._size, self._w
        length = len(record)
        off = w % size
        tail = size - off
        pad = tail if tail < length else 0
        if w + pad + length - self._ring.read_pos() > size:
            return False
        view = self._view
        if pad:
            _REC.pack_into(view, HEADER + off, pad, PAD)
            w += pad
            off = 0
        view[HEADER + off : HEADER + off + len(record)] = record
        self._w = w + length
        _POS.pack_into(view, _W_OFF, self._w)  # published last: the record is whole before the consumer sees it
        return True


class RingReader:
    """The consumer's side: decodes the records between a position and the producer's write position."""

    def __init__(
        self, ring: Ring, start: int | None = None, names: Mapping[int, str] | None = None, items_from: int = 0
    ) -> None:
        """``start``: a position (default: the ring's read position); ``names``: the phase names announced before
        it (the producer's own, when the producer takes over the reading); ``items_from``: the items and steps
        before this position were applied already (a reader resuming a step begun before its last commit reads
        that step's events again, nothing else)."""
        self.ring = ring
        self.pos = ring.read_pos() if start is None else start
        self.names: dict[int, str] = dict(names or {})
        self._items_from = items_from

    def records(self) -> Iterator[tuple[str, Any]]:
        """``("event", (event, position))`` and ``("item", wire.Item)`` in order,
        up to the write position as read now; :attr:`pos` follows each record. Phase names are learnt as they
        pass (into :attr:`names`)."""
        ring, view, size = self.ring, self.ring.view, self.ring.size
        end = ring.write_pos()
        while self.pos < end:
            off = self.pos % size
            length, kind = _REC.unpack_from(view, HEADER + off)
            if length < 8 or length % 8 or off + length > size:
                raise ValueError(f"corrupt ring record at {self.pos}: length {length}, kind {kind}")
            body = HEADER + off + _REC.size
            at, self.pos = self.pos, self.pos + length
            if kind == EVENTS:
                got = array("d")
                got.frombytes(view[HEADER + off + _EVENTS.size : HEADER + off + length])
                for i in range(0, len(got), EVENT_DOUBLES):
                    code, a, t, x, y = got[i : i + EVENT_DOUBLES]
                    yield "event", ((int(code), int(a), t, x, y), at)
            elif at < self._items_from and kind != NAME:
                continue
            elif kind == NAME:
                (ident,) = struct.unpack_from("<H", view, body)
                n = length - _REC.size - 2
                self.names[ident] = bytes(view[body + 2 : body + 2 + n]).rstrip(b"\0").decode()
            elif kind == BLOB:
                for item in decode(bytes(view[body : HEADER + off + length]).rstrip(b"\0")):
                    yield "item", item
