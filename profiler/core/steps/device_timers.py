"""Which device a run uses, and how its phases are timed on that device.

Two timers stand behind one interface: on CPU there is no device clock, phases are timed by the host
``perf_counter`` alone and ``mark()`` returns None; on CUDA ``mark()`` records an event in the current
stream. Events are resolved later, without a per-step synchronize, by the steps' device marks in flight
(:class:`profiler.core.steps.device_marks.DeviceMarks`), which only ask ``done``/``wait``/``time_of``.

Device times are put on the host timeline through one reference event recorded and synchronised when the
timer starts: ``t = t_ref + ref.elapsed_time(ev)``, ``t_ref`` the middle of the clock reads around it, the
tightest of a few tries. The alignment error (half their distance: tens of microseconds unless the host preempted
every try) is the same for every event, so device intervals stay exact relative to each other.
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, cast

_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|cuda:\d+|sim:.*)$")
ALLOWED = (
    "auto, cpu, cuda, cuda:N, sim:NAME[,precision=fp32|tf32|amp][,efficiency=E][,link=pcie|nvlink][,launch=sleep|gil]"
)


# ``sim:`` device strings -> (the simulator's SimConfig, the device's full name); ValueError naming what is allowed.
# Installed by the layer above (profiler/runs/sinks.py: profiler.sim), so that the core imports no simulator.
SIMULATED: list[Callable[[str], tuple[object, str]]] = []


class DeviceError(ValueError):
    """A device string that is malformed or names a device this machine does not have."""


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """Where the model trains. A simulated accelerator (``kind == "sim"``) trains nowhere: its tensors stay on
    the host (``torch_device`` "cpu") and ``sim`` (a ``profiler.sim.specs.SimConfig``) models the device."""

    kind: str  # "cpu" | "cuda" | "sim"
    torch_device: str  # "cpu", "cuda:0"
    name: str
    index: int | None = None
    sim: Any = None

    @property
    def accelerator(self) -> bool:
        """A CUDA device or a simulated one: scenarios use their accelerator settings (image size) on it."""
        return self.kind in ("cuda", "sim")

    @property
    def label(self) -> str:
        """How messages and tables name the device: ``cuda:0``, ``cpu``, or for a simulated one the string that
        makes it again (``sim:h100,precision=tf32,efficiency=0.15 (simulated)``: its tensors sit on the host, so its
        torch device would say ``cpu``)."""
        return f"{self.sim.label()} (simulated)" if self.sim is not None else self.torch_device

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "torch_device": self.torch_device, "name": self.name}
        out["index"] = self.index
        if self.sim is not None:
            out["sim"] = {"device": self.sim.label(), **self.sim.to_dict()}
        return out


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass  # not Linux: fall back to platform below
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def resolve_device(spec: str, torch_mod: ModuleType | None = None) -> DeviceInfo:
    """``auto|cpu|cuda|cuda:N|sim:NAME[,...]`` -> DeviceInfo; DeviceError naming the value and what is allowed."""
    if not isinstance(spec, str) or not _DEVICE_RE.match(spec):
        raise DeviceError(f"--device {spec!r} is not valid: allowed {ALLOWED}")
    if spec == "cpu":
        return DeviceInfo("cpu", "cpu", cpu_name())
    if spec.startswith("sim:"):
        if not SIMULATED:
            raise DeviceError(f"--device {spec!r}: no simulated devices here (profiler.sim is not installed)")
        try:
            config, name = SIMULATED[0](spec)
        except ValueError as exc:  # the simulator's SimSpecError
            raise DeviceError(str(exc)) from None
        return DeviceInfo("sim", "cpu", f"{name} (simulated)", sim=config)
    torch_mod = _torch(torch_mod)
    has_cuda = bool(torch_mod.cuda.is_available())
    if spec == "auto":
        if not has_cuda:
            return DeviceInfo("cpu", "cpu", cpu_name())
        spec = "cuda:0"
    if not has_cuda:
        raise DeviceError(
            f"--device {spec} asked for CUDA but torch.cuda.is_available() is False on this machine: "
            "allowed here auto, cpu or sim:NAME (a simulated accelerator)"
        )
    index = int(spec.split(":")[1]) if ":" in spec else 0
    count = int(torch_mod.cuda.device_count())
    if index >= count:
        raise DeviceError(f"--device {spec}: this machine has {count} CUDA device(s): allowed cuda:0..cuda:{count - 1}")
    return DeviceInfo("cuda", f"cuda:{index}", str(torch_mod.cuda.get_device_name(index)), index)


def _torch(torch_mod: ModuleType | None) -> ModuleType:
    """``torch_mod`` (a stand-in in tests), else torch itself, imported only when a CUDA device is asked for."""
    if torch_mod is not None:
        return torch_mod
    import torch

    return torch


class _CudaEvent(Protocol):
    """What the timer calls on a ``torch.cuda.Event``."""

    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: _CudaEvent, /) -> float: ...


class DeviceTimer(Protocol):
    """Marks points in the device's work queue and turns them into times on the run's timeline.

    An event is an opaque token: only the timer whose ``mark()`` returned it reads it."""

    kind: str

    def mark(self) -> object: ...

    def done(self, ev: object) -> bool: ...

    def wait(self, ev: object) -> None: ...

    def time_of(self, ev: object) -> float: ...

    def release(self, ev: object) -> None: ...


REF_TRIES = 5  # reference events tried when a CUDA timer starts (the start-up module's DeviceClock does the same)


class CudaEventTimer:
    """CUDA events on the current stream; pooled so a long run allocates a bounded number of events."""

    kind = "cuda-events"

    def __init__(self, device: DeviceInfo, now: Callable[[], float], torch_mod: ModuleType | None = None) -> None:
        self._cuda = _torch(torch_mod).cuda
        self._dev = device.index
        self._pool: list[_CudaEvent] = []
        self._cuda.synchronize(self._dev)
        # on the idle device a reference is reached between the clock reads around it: of REF_TRIES, the one whose
        # reads are closest, at their middle (one read after the synchronize alone was late by any preemption)
        tries = []
        for _ in range(REF_TRIES):
            ev, before = self._new(), now()
            ev.record()
            ev.synchronize()
            tries.append((now() - before, before, ev))
        width, before, self._ref = min(tries, key=lambda t: t[0])
        self._ref_t = before + width / 2

    def _new(self) -> _CudaEvent:
        ev: _CudaEvent = self._cuda.Event(enable_timing=True)
        return ev

    def mark(self) -> _CudaEvent:
        ev = self._pool.pop() if self._pool else self._new()
        ev.record()
        return ev

    def done(self, ev: object) -> bool:
        return bool(_event(ev).query())

    def wait(self, ev: object) -> None:
        _event(ev).synchronize()

    def time_of(self, ev: object) -> float:
        return self._ref_t + float(self._ref.elapsed_time(_event(ev))) / 1e3

    def release(self, ev: object) -> None:
        if len(self._pool) < 4096:
            self._pool.append(_event(ev))


def _event(ev: object) -> _CudaEvent:
    """An event this timer's ``mark()`` returned (the Session hands back only those; no check on the hot path)."""
    return cast(_CudaEvent, ev)


def make_timer(device: DeviceInfo, now: Callable[[], float]) -> DeviceTimer | None:
    """The device timer for ``device``: None on CPU (host timing is all there is)."""
    if device.kind == "cuda":
        return CudaEventTimer(device, now)
    return None
