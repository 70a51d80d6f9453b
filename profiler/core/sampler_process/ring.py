"""The shared-memory ring between the training process (one producer side) and its sampler process (the consumer).

An anonymous memory file (``memfd``) mapped by both processes: a header, then a byte ring of records. The
training thread appends each step event (:mod:`profiler.core.steps.events`: a clock reading at a step or phase
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
- The ring never blocks the producer, and a kill of the producer takes nothing it handed on: a record that does
  not fit makes the ring **grow**. A new memory file (a segment) twice the size of the last, up to
  ``MAX_SEGMENT``, is sent to the consumer over a Unix socket (``SCM_RIGHTS``: the kernel holds it in the
  socket's queue, so it reaches the consumer even if the producer dies right after), then a ``NEXT`` record
  in the old segment says where the stream goes on; the consumer follows it, and the producer unmaps an old
  segment once the store has committed past it. Positions are global across segments (a segment starts at the
  position its ``NEXT`` record ends), so the read and write positions, the header and the store's ``ring_pos``
  stay in the first segment and mean what they meant. Every record leaves room for a ``NEXT`` after it
  (``RESERVE``). Only where a segment cannot be made (no memory, the file size limit, no consumer to tell)
  does a record wait in the producer's spill list, in order, and go in ahead of any later record once there is
  room (:meth:`RingWriter.flush`).
- The header holds the index of the last step the training process opened (``taken``: an 8-byte store a step, on
  a mapping of its own so that the Session's hot path can keep it past the ring's close), so a consumer that
  outlives a killed producer can say how many steps were taken, beside those it stored.
- The consumer's store failure (disk full, ...) is written to the header, so the training process can stop on
  it (``store_errors="raise"``) with one unpack per step.
"""

from __future__ import annotations

import mmap
import os
import resource
import socket
import struct
import threading
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from profiler.core.sampler_process.wire import (
    BLOB,
    EVENT_DOUBLES,
    EVENTS,
    EVENTS_PER_RECORD,
    NAME,
    NEXT,
    PAD,
    Item,
    decode,
    encode,
)
from profiler.core.steps.events import Event

MAGIC = 0x53535247  # "SSRG"
VERSION = 3  # 3: segments (NEXT), the steps taken
HEADER = 4096  # the header's page; the ring's bytes follow
DEFAULT_SIZE = 8 << 20  # at a 2 ms step with 3 phases (~200 bytes a step), about 80 s of steps
# a segment is at most this big; past it the ring goes on in segments of this size (a loop that outruns the
# sampler process by 256 MiB of records, about a million steps of two phases, then holds 256 MiB more at most)
MAX_SEGMENT = 256 << 20
ANNOUNCE_TIMEOUT_S = 10.0  # a NEXT record's segment is in the socket's queue before the record: this is slack
# header fields: magic, version, size, write, read, failed, last_kept
_HEAD = struct.Struct("<IIQQQIxxxxq")
_W_OFF, _R_OFF, _FAIL_OFF, _KEPT_OFF = 16, 24, 32, 40
# the steps taken, stored at every step: on a cache line of its own, apart from the positions the other side reads
_TAKEN_OFF = HEADER - 64
_NEXT = struct.Struct("<IQQ")  # a NEXT record's payload, and the segment's message: its number, size, start
_NEXT_LEN = 32  # a NEXT record with its head, padded
RESERVE = 64  # room every record leaves after it: a NEXT record (32) and the pad before it (at most 24)
_MSG_OFF = 64  # the failure's message: u16 length, then UTF-8
_MSG_MAX = 2000
_POS = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_REC = struct.Struct("<IB")  # a record's length (with this head and padding) and kind
_EVENTS = struct.Struct("<IBxxx")  # a record of step events: its length and kind, then 5 doubles an event


class Ring:
    """The mapping of one ring's memory file, on either side."""

    def __init__(
        self, fd: int, size: int, *, create: bool, base: int = 0, index: int = 0, populate: bool = True
    ) -> None:
        """``base``: the global position where this segment's bytes begin (0 for the first); ``index``: its number
        (0: the first, whose header holds the positions); ``populate``: map it populated (the producer's first)."""
        self.fd = fd
        self.size = size
        self.base = base
        self.index = index
        if create:
            os.ftruncate(fd, HEADER + size)
        # the producer maps the first segment populated: a page first touched mid-run faults on the training thread
        # (on a VM, tens of microseconds a page: benchmarks/overhead.py). A later one too where the watch thread
        # makes it ahead (RingWriter.prepare); one the training thread must make at once is not: populating 16 MiB
        # took 10 ms of its time at once here, where the first pass of writes faults the pages in over the steps
        # (14 ms in all; the spill list's bytes objects it replaces cost 10 ms: docs/architecture.md)
        flags = getattr(mmap, "MAP_POPULATE", 0) if create and populate else 0
        self.mem = mmap.mmap(fd, HEADER + size, flags=mmap.MAP_SHARED | flags)
        if hasattr(mmap, "MADV_DONTFORK"):
            self.mem.madvise(mmap.MADV_DONTFORK)  # a DataLoader's forked workers do not inherit it
        if create:
            _HEAD.pack_into(self.mem, 0, MAGIC, VERSION, size, base, base, 0, -1)
            _I64.pack_into(self.mem, _TAKEN_OFF, -1)  # no step opened yet
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

    @classmethod
    def segment(cls, size: int, index: int, base: int, *, populate: bool = False) -> Ring:
        """A later segment of ``size`` bytes starting at global position ``base``; OSError where it cannot be made
        (no memory, over the file size limit)."""
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and HEADER + size > limit:
            raise OSError(f"a ring segment of {size} bytes is over the file size limit ({limit} bytes)")
        fd = os.memfd_create(f"stallscope-ring-{index}")
        try:
            return cls(fd, size, create=True, base=base, index=index, populate=populate)
        except BaseException:
            os.close(fd)
            raise

    def drop_fd(self) -> None:
        """Close the memory file's descriptor; the mapping stays (a segment, once sent to the consumer)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def counter(self) -> memoryview:
        """The header's index of the last step opened (-1: none), as one writable int64 on a mapping of its own: the
        Session's hot path stores into it at each step's opening, and may hold it past :meth:`close` (the mapping
        goes with the last holder)."""
        mem = mmap.mmap(self.fd, HEADER, flags=mmap.MAP_SHARED)
        if hasattr(mmap, "MADV_DONTFORK"):
            mem.madvise(mmap.MADV_DONTFORK)
        return memoryview(mem)[_TAKEN_OFF : _TAKEN_OFF + 8].cast("q")

    def taken(self) -> int:
        """Steps the training process has opened (the first segment's header holds the last one's index)."""
        return int(_I64.unpack_from(self.mem, _TAKEN_OFF)[0]) + 1

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
        self.drop_fd()


class Segments(Protocol):
    """Where a reader finds the ring's segments: the consumer's (sent over a socket), or the producer's own (a
    take-over reads through the writer's)."""

    def segment_at(self, pos: int) -> Ring:
        """The segment that holds global position ``pos``."""

    def next_segment(self, index: int, size: int, base: int) -> Ring:
        """Segment ``index`` (a NEXT record named it)."""

    def left(self, seg: Ring) -> None:
        """A reader passed the end of ``seg``."""


def send_segment(sock: socket.socket, seg: Ring) -> None:
    """The producer's side: ``seg``'s memory file to the consumer (non-blocking; OSError where it cannot go)."""
    socket.send_fds(sock, [_NEXT.pack(seg.index, seg.size, seg.base)], [seg.fd], socket.MSG_NOSIGNAL)


class Announced:
    """The consumer's segments: the first, and each later one as the producer sent it (in order, over ``sock``);
    a segment is unmapped once read past (the producer keeps its own until the store commits past it)."""

    def __init__(self, first: Ring, sock: socket.socket) -> None:
        self._first = first
        self._sock = sock

    def segment_at(self, pos: int) -> Ring:
        return self._first

    def next_segment(self, index: int, size: int, base: int) -> Ring:
        self._sock.settimeout(ANNOUNCE_TIMEOUT_S)
        msg, fds, _flags, _addr = socket.recv_fds(self._sock, _NEXT.size, 1)
        if len(fds) != 1 or len(msg) != _NEXT.size or _NEXT.unpack(msg) != (index, size, base):
            for fd in fds:
                os.close(fd)
            raise ValueError(f"ring segment {index} ({size} bytes at {base}): the socket sent {msg!r}, {len(fds)} fds")
        return Ring(fds[0], size, create=False, base=base, index=index)

    def left(self, seg: Ring) -> None:
        if seg is not self._first:
            seg.close()


class RingWriter:
    """The training process's side: packs steps and JSON items into the ring (any thread, one lock)."""

    def __init__(self, ring: Ring, announce: Callable[[Ring], None] | None = None) -> None:
        """``announce``: sends a new segment to the consumer (:func:`send_segment`); None: the ring does not grow
        (a full one spills) until :meth:`grow_here`."""
        self._first = ring  # its header holds the positions, the failure and the steps taken
        self._ring = ring  # the segment written now
        self._rings = [ring]  # the segments a reader may still need, oldest first (the first always)
        self._announce = announce
        self._size = ring.size  # a record is at most half the first segment (later ones are larger)
        self._w = ring.write_pos()
        # the step events not yet in the ring: the training thread's Session appends to it (``put``), one C call an
        # event, atomic under the GIL from any thread; flush_events() moves them in
        self.events = array("d")
        self.put: Callable[[Event], object] = self.events.extend
        # the steps taken: the Session's step clock stores each step's count here (StepClock.send_to)
        self.taken = ring.counter()
        self._lock = threading.Lock()
        self._names: dict[str, int] = {}
        self._spill: deque[bytes] = deque()
        self.spilled = 0  # records that waited in the spill list (the ring could not grow: see the module)
        self.grew = 0  # segments added
        self._spare: Ring | None = None  # the next segment, made ahead by the watch thread (prepare)
        self.prepared = 0  # segments made ahead

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
            fit = (self._size // 2 - RESERVE - _EVENTS.size) // (8 * EVENT_DOUBLES)  # at most half the first
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
        if len(record) + RESERVE > self._size // 2:
            raise ValueError(f"a ring record of {len(record)} bytes is over half the ring ({self._size} bytes)")
        if self._spill or not (self._write(record) or self._grow(record)):
            self._spill.append(record)
            self.spilled += 1
            self._flush()

    def flush(self) -> bool:
        """Move what spilled into the ring while there is room (growing it where it can), and unmap the segments
        the store has committed past; True when nothing is left waiting."""
        with self._lock:
            self._release()
            return self._flush()

    def _flush(self) -> bool:
        spill = self._spill
        while spill and (self._write(spill[0]) or self._grow(spill[0])):
            spill.popleft()
        return not spill

    def prepare(self) -> None:
        """The watch thread's round: where the segment written now is over 3/4 full, make the next one ahead,
        populated, off the training thread and outside the lock (mmap releases the GIL): the training thread's
        writes then fault no page in (16 MiB: 14 ms of its time unpopulated, 2 ms populated, here)."""
        with self._lock:
            seg = self._ring
            used = self._w - max(self._first.read_pos(), seg.base)
            if self._announce is None or self._spare is not None or 4 * used < 3 * seg.size:
                return
            size = min(2 * seg.size, MAX_SEGMENT)
        try:
            spare: Ring | None = Ring.segment(size, 0, 0, populate=True)  # its number and start are set at its use
        except OSError:
            return
        with self._lock:
            if self._spare is None:
                self._spare, spare = spare, None
                self.prepared += 1
        if spare is not None:
            spare.close()

    def grow_here(self) -> None:
        """The consumer is this process from now on (a take-over): a full ring grows without telling anyone."""
        with self._lock:
            self._announce = _nobody

    def names(self) -> dict[int, str]:
        """The phase names announced so far, by id."""
        with self._lock:
            return {ident: name for name, ident in self._names.items()}

    def pending(self) -> int:
        """Records waiting in the spill list."""
        return len(self._spill)

    def segments_held(self) -> int:
        """The segments mapped here: the first, the one written now, and those the store has not committed past."""
        with self._lock:
            return len(self._rings)

    def _write(self, record: bytes, reserve: int = RESERVE) -> bool:
        """Copy ``record`` in at the write position (a pad first where it would cross the end); False when the
        segment has no room for it and ``reserve`` bytes after it yet."""
        seg = self._ring
        size, w = seg.size, self._w
        length = len(record)
        off = (w - seg.base) % size
        tail = size - off
        pad = tail if tail < length else 0
        if w + pad + length + reserve - max(self._first.read_pos(), seg.base) > size:
            return False
        view = seg.view
        if pad:
            _REC.pack_into(view, HEADER + off, pad, PAD)
            w += pad
            off = 0
        view[HEADER + off : HEADER + off + length] = record
        self._w = w + length
        _POS.pack_into(self._first.view, _W_OFF, self._w)  # published last: the record is whole before it is seen
        return True

    def _grow(self, record: bytes) -> bool:
        """The ring goes on in a new segment (twice the last, up to MAX_SEGMENT), sent to the consumer before the
        NEXT record that names it; then ``record`` goes in there. False (and no more growing until
        :meth:`grow_here`) where a segment cannot be made or sent: the record then spills."""
        announce, seg = self._announce, self._ring
        if announce is None:
            return False
        tail = seg.size - (self._w - seg.base) % seg.size
        base = self._w + (tail if tail < _NEXT_LEN else 0) + _NEXT_LEN  # where the NEXT record ends
        new, self._spare = self._spare, None
        if new is not None and new.size < seg.size:  # made for a smaller segment than the one now written
            new.close()
            new = None
        try:
            if new is None:
                new = Ring.segment(min(2 * seg.size, MAX_SEGMENT), seg.index + 1, base)
            else:
                new.index, new.base = seg.index + 1, base
        except OSError:
            self._announce = None
            return False
        try:
            announce(new)
        except OSError:  # the consumer is gone, or its socket is full: nothing was sent
            new.close()
            self._announce = None
            return False
        new.drop_fd()  # the consumer has its own (in the socket's queue until it reads it); the mapping stays
        nxt = _REC.pack(_NEXT_LEN, NEXT) + _NEXT.pack(new.index, new.size, base)
        wrote = self._write(nxt + bytes(_NEXT_LEN - len(nxt)), 0)
        if not wrote or self._w != base:  # RESERVE keeps its room after every record
            raise AssertionError(f"ring: no room for the NEXT record at {self._w} (segment {seg.index})")
        self._ring = new
        self._rings.append(new)
        self.grew += 1
        self._release()
        return self._write(record)

    def _release(self) -> None:
        """Unmap the old segments the store has committed past (never the first: its header is the ring's)."""
        read = self._first.read_pos()
        rings = self._rings
        while len(rings) > 2 and read >= rings[2].base:
            rings.pop(1).close()

    # -- the writer's segments, for a reader in this process (a take-over) -----------------------------------
    def segment_at(self, pos: int) -> Ring:
        with self._lock:
            return next(r for r in reversed(self._rings) if r.base <= pos)

    def next_segment(self, index: int, size: int, base: int) -> Ring:
        with self._lock:
            return next(r for r in self._rings if r.index == index)

    def left(self, seg: Ring) -> None:
        """A reader here passed ``seg``: the writer unmaps it once the store commits past it."""

    def close(self) -> None:
        """Unmap every segment but the first (whose owner closes it)."""
        with self._lock:
            for seg in self._rings[1:]:
                seg.close()
            del self._rings[1:]
            if self._spare is not None:
                self._spare.close()
                self._spare = None


def _nobody(seg: Ring) -> None:
    """A segment's announcement where the consumer is this process itself."""


class RingReader:
    """The consumer's side: decodes the records between a position and the producer's write position."""

    def __init__(
        self,
        ring: Ring,
        start: int | None = None,
        names: Mapping[int, str] | None = None,
        items_from: int = 0,
        segments: Segments | None = None,
    ) -> None:
        """``ring``: the first segment (its header); ``start``: a position (default: the ring's read position);
        ``names``: the phase names announced before it (the producer's own, when the producer takes over the
        reading); ``items_from``: the items and steps before this position were applied already (a reader resuming
        a step begun before its last commit reads that step's events again, nothing else); ``segments``: where the
        later segments are found (None: a ring that does not grow)."""
        self.ring = ring
        self.pos = ring.read_pos() if start is None else start
        self.names: dict[int, str] = dict(names or {})
        self._items_from = items_from
        self._segments = segments
        self.seg = segments.segment_at(self.pos) if segments is not None else ring  # the segment read now

    def records(self) -> Iterator[tuple[str, Any]]:
        """``("event", (event, position))`` and ``("item", wire.Item)`` in order,
        up to the write position as read now; :attr:`pos` follows each record (and :attr:`seg` each NEXT).
        Phase names are learnt as they pass (into :attr:`names`)."""
        end = self.ring.write_pos()
        while self.pos < end:
            seg = self.seg
            view, size = seg.view, seg.size
            off = (self.pos - seg.base) % size
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
            elif kind == NEXT:
                self._next(*_NEXT.unpack_from(view, body))
            elif at < self._items_from and kind != NAME:
                continue
            elif kind == NAME:
                (ident,) = struct.unpack_from("<H", view, body)
                n = length - _REC.size - 2
                self.names[ident] = bytes(view[body + 2 : body + 2 + n]).rstrip(b"\0").decode()
            elif kind == BLOB:
                for item in decode(bytes(view[body : HEADER + off + length]).rstrip(b"\0")):
                    yield "item", item

    def _next(self, index: int, size: int, base: int) -> None:
        """A NEXT record: the stream goes on at ``base`` in segment ``index``."""
        if self._segments is None or base != self.pos:
            raise ValueError(f"ring: a NEXT record to segment {index} at {base}, read at {self.pos}, no way to follow")
        seg, self.seg = self.seg, self._segments.next_segment(index, size, base)
        self._segments.left(seg)
