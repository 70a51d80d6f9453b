"""Everything that crosses between the training process and its sampler process, in one place (docs/architecture.md,
"Two processes"): the ring's record kinds, the typed items that travel in the ring beside the step events, and the
lines the sampler process writes to its stdout.

- **Ring records** (:mod:`profiler.core.sampler_process.ring`): ``EVENTS`` (the step events: ``EVENT_DOUBLES``
  doubles an event, :mod:`profiler.core.steps.events`), ``NAME`` (a phase name's id, announced before its first
  event), ``BLOB`` (one item, as a JSON object), ``PAD`` (the rest of the ring before it wraps), ``NEXT`` (the
  ring goes on in a new segment: its number, size and start, the memory file sent over the segments' socket).
- **Items** (in the ring, in order with the steps): the run's facts (:class:`Meta`), a run event
  (:class:`RunEvent`), the in-process sources' readings (:class:`Samples`), asks (:class:`Rescan`,
  :class:`ReadMemory`, :class:`PySpy`) and the close (:class:`Close`). Each is one JSON object with one key, so a
  reader skips a key it does not know (:func:`decode`).
- **Lines** (the sampler process's stdout, one JSON object a line): :class:`Ready` (its sources are open),
  :class:`Log` (its warnings, logged by the training process as its own), :class:`Final` (where it left the run's
  rows when the store failed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# -- the ring's records --------------------------------------------------------------------------------------------
PAD, NAME, BLOB, EVENTS, NEXT = 0, 2, 3, 5, 6  # record kinds (1 and 4 are not used)
EVENT_DOUBLES = 5  # code, name id, t, x, y (profiler.core.steps.events)
EVENTS_PER_RECORD = 8192  # 320 KiB: a flush of more goes as several records


# -- the ring's items ----------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Meta:
    """Run facts for the store's meta (and the views' feed)."""

    items: dict[str, Any]


@dataclass(frozen=True, slots=True)
class RunEvent:
    """A run event (a source's problem, a warning) at ``t`` on the run's clock."""

    t: float
    kind: str
    source: str | None
    message: str


@dataclass(frozen=True, slots=True)
class Samples:
    """Readings of the sources only the training process can read (rows as the sampler makes them)."""

    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Rescan:
    """The loader's worker processes changed: look for them now."""


@dataclass(frozen=True, slots=True)
class ReadMemory:
    """Read the loader workers' memory now (the first epoch's asks: docs/metrics.md); with ``taken``, the readings
    the training process took of them itself at ``t`` (its loop's end: pid -> USS, PSS, shared MiB), to store."""

    t: float = 0.0
    taken: dict[int, tuple[float, float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PySpy:
    """Start py-spy on ``pid`` (its problems are warnings, ``unavailable`` the one for a missing py-spy)."""

    pid: int
    rate: int
    attach_timeout_s: float
    unavailable: str


@dataclass(frozen=True, slots=True)
class Close:
    """The run ended: its status and error, and the health of the training process's own sources."""

    status: str
    error: str | None = None
    local_sources: dict[str, Any] = field(default_factory=dict)


Item = Meta | RunEvent | Samples | Rescan | ReadMemory | PySpy | Close


def encode(item: Item) -> bytes:
    """An item as the JSON object of one key that a ``BLOB`` record holds."""
    if isinstance(item, Meta):
        obj: dict[str, Any] = {"meta": item.items}
    elif isinstance(item, RunEvent):
        obj = {"event": [item.t, item.kind, item.source, item.message]}
    elif isinstance(item, Samples):
        obj = {"samples": [list(r) for r in item.rows]}
    elif isinstance(item, Rescan):
        obj = {"rescan": 1}
    elif isinstance(item, ReadMemory):
        obj = {"memory": {"t": item.t, "taken": {str(k): list(v) for k, v in item.taken.items()}} if item.taken else 1}
    elif isinstance(item, PySpy):
        obj = {"pyspy": {"pid": item.pid, "rate": item.rate, "attach_timeout_s": item.attach_timeout_s,
                         "unavailable": item.unavailable}}  # fmt: skip
    else:
        obj = {"close": {"status": item.status, "error": item.error, "local_sources": item.local_sources}}
    return json.dumps(obj, allow_nan=True, default=str).encode()


def decode(raw: bytes) -> Iterator[Item]:
    """The items of one ``BLOB`` record (keys this side does not know are skipped)."""
    obj: Mapping[str, Any] = json.loads(raw)
    for key, v in obj.items():
        if key == "meta":
            yield Meta(dict(v))
        elif key == "event":
            yield RunEvent(float(v[0]), str(v[1]), None if v[2] is None else str(v[2]), str(v[3]))
        elif key == "samples":
            yield Samples([list(r) for r in v])
        elif key == "rescan":
            yield Rescan()
        elif key == "memory":
            got = v if isinstance(v, Mapping) else {}
            taken = {int(k): (float(a), float(b), float(c)) for k, (a, b, c) in (got.get("taken") or {}).items()}
            yield ReadMemory(float(got.get("t", 0.0)), taken)
        elif key == "pyspy":
            yield PySpy(int(v["pid"]), int(v["rate"]), float(v["attach_timeout_s"]), str(v["unavailable"]))
        elif key == "close":
            yield Close(str(v["status"]), v.get("error"), dict(v.get("local_sources") or {}))


# -- the sampler process's stdout lines ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Ready:
    """The sampler process's sources are open and its first reading is under way."""


@dataclass(frozen=True, slots=True)
class Log:
    """One of its warnings, at a ``logging`` level."""

    level: int
    message: str


@dataclass(frozen=True, slots=True)
class Final:
    """Where it left the run's rows (a pickle) when the store stopped writing."""

    path: str


Line = Ready | Log | Final


def line(said: Line) -> bytes:
    """One stdout line (JSON, newline-terminated)."""
    if isinstance(said, Ready):
        obj: dict[str, Any] = {"ready": True}
    elif isinstance(said, Log):
        obj = {"log": [said.level, said.message]}
    else:
        obj = {"final": said.path}
    return json.dumps(obj).encode() + b"\n"


def heard(raw: bytes) -> Line | None:
    """A stdout line read back; None for one that is not this module's (a stray print)."""
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if obj.get("ready"):
        return Ready()
    if isinstance(obj.get("log"), list) and len(obj["log"]) == 2:
        return Log(int(obj["log"][0]), str(obj["log"][1]))
    if "final" in obj:
        return Final(str(obj["final"]))
    return None
