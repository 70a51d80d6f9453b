"""The simulated accelerator: two streams with CUDA's ordering, on the host's own clock (docs/sim.md).

Invariants: the host waits for the device exactly where a CUDA training loop waits (a pageable copy, a full
launch queue of ``QUEUE_LIMIT`` launches, the end of the run) and nowhere else; times are ``clock()``
readings on the host's timeline, so a stall is wall time the host really spent waiting. :class:`SimTimer`
puts the device behind the Session's device-timer interface, so its figures come from the same code as
CUDA's. The observation methods (``busy_s``, ``copied_bytes``, ``memory_bytes``) are thread-safe.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from profiler.sim.cost import StepCost
from profiler.sim.roofline import host_s, kernel_times, lead_s
from profiler.sim.specs import FRAMEWORK_S, LAUNCH_S, SimConfig

# ``launch=gil``: the share of a kernel's launch interval spent in the op binding's Python part, the GIL held; the
# rest is its C++ dispatch (argument checks, the dispatcher, autograd's records, the driver call), the GIL released
GIL_HELD_SHARE = 0.5
_BLOCK = bytes(4096)  # hashlib releases the GIL for inputs of 2 KiB and more; 4 KiB hash in about 3 us here


def _dispatch(until_cpu_s: float) -> None:
    """Spend the calling thread's CPU up to ``until_cpu_s`` (its ``thread_time``) with the GIL released, and take it
    back: an op's C++ dispatch. A thread that takes the GIL meanwhile keeps it until this one's wait for it reaches
    the switch interval."""
    cpu, sha = time.thread_time, hashlib.sha256
    while cpu() < until_cpu_s:
        sha(_BLOCK)


# Kernel launches CUDA queues before a launch blocks the host (the driver's pushbuffer: about 1,024 entries).
QUEUE_LIMIT = 1024
# Device memory taken before the model's tensors: CUDA context, cuDNN/cuBLAS workspaces (an estimate).
CONTEXT_BYTES = 512 << 20
# Per-hop latency of a ring all-reduce step (NCCL over PCIe or NVLink: a few microseconds; an estimate).
HOP_LATENCY_S = 10e-6
# DistributedDataParallel's gradient bucket (bucket_cap_mb=25): the last bucket's all-reduce cannot overlap backward.
BUCKET_BYTES = 25 << 20
# Backward's share of a training step's device time: backward costs about twice the forward's FLOPs.
BACKWARD_SHARE = 2.0 / 3.0
_GIB = float(1 << 30)
_LOOKBACK_S = 60.0


class SimOutOfMemory(RuntimeError):
    """The step needs more device memory than the simulated accelerator has: the configuration fails, as it
    would on the real device."""


@dataclass(frozen=True, slots=True)
class SimOp:
    """One operation the simulated device executed: ``[start, end)`` on ``stream`` (clock seconds)."""

    stream: str  # "compute" | "copy"
    kind: str  # "step" | "h2d" | "allreduce"
    start: float
    end: float
    nbytes: int = 0
    busy_s: float = 0.0  # time kernels executed within [start, end): the whole op, or less when launch-bound
    issued: float = math.nan  # when the host issued it (clock seconds)
    kernels: int = 1  # kernels it is made of, launched one launch interval apart from ``issued``


class SimDevice:
    """One simulated accelerator running the training loop's work. See the module docstring."""

    def __init__(
        self,
        config: SimConfig,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        launch_s: float = LAUNCH_S,
        framework_s: float = FRAMEWORK_S,
        queue_limit: int = QUEUE_LIMIT,
        history: int = 65536,
    ) -> None:
        self.config = config
        self.clock = clock
        self._sleep = sleep
        self.launch_s = launch_s
        self.framework_s = framework_s
        self.queue_limit = queue_limit
        self.cost: StepCost | None = None
        self._times: tuple[float, ...] = ()  # the loaded step's kernels, seconds each
        self._work_s = 0.0  # their sum: the loaded step's device time
        self._lead = 0.0  # seconds from a step's issue to its last kernel's end on an idle device
        self._lock = threading.Lock()
        self._compute_tail = -math.inf
        self._copy_tail = -math.inf
        self._copy_ready = -math.inf  # end of the last side-stream copy the next step must wait for
        self._in_flight: deque[float] = deque()  # ends of queued steps, oldest first
        self._ops: deque[SimOp] = deque(maxlen=history)
        self.steps = 0
        self.busy_total_s = 0.0
        self.copied_total = 0
        # while a kernel window is open: each kernel, copy and all-reduce as (stream, kind, start, end, launch)
        self._log: list[tuple[int, int, float, float, float]] | None = None

    # -- set-up -----------------------------------------------------------------------------------------
    @property
    def memory_total_bytes(self) -> int:
        return int(self.config.spec.memory_gib * _GIB)

    @staticmethod
    def memory_needed(cost: StepCost) -> int:
        """Device memory a step of ``cost`` takes: its tensors and the CUDA context."""
        return cost.memory_bytes + CONTEXT_BYTES

    def load(self, cost: StepCost) -> None:
        """Place the model: from now on ``step()`` costs ``cost``. SimOutOfMemory when it does not fit."""
        need = self.memory_needed(cost)
        if need > self.memory_total_bytes:
            raise SimOutOfMemory(
                f"simulated out of memory: batch {cost.batch_size} needs about {need / _GIB:.1f} GiB on the "
                f"{self.config.spec.name} (weights {cost.param_bytes / _GIB:.2f}, gradients "
                f"{cost.grad_bytes / _GIB:.2f}, optimizer {cost.optimizer_bytes / _GIB:.2f}, activations "
                f"{cost.activation_bytes / _GIB:.2f}, CUDA context {CONTEXT_BYTES / _GIB:.1f}) of "
                f"{self.config.spec.memory_gib:g} GiB (estimated, docs/sim.md)"
            )
        self.cost = cost
        self._times = self.kernel_times(cost)
        self._work_s = sum(self._times)
        self._lead = lead_s(self._times, self.launch_interval_s(cost))

    def kernel_times(self, cost: StepCost | None = None) -> tuple[float, ...]:
        """Seconds each of one step's kernels runs (``cost``, else the loaded one): its FLOPs at the achieved
        rate or its bytes at the achieved bandwidth, whichever is longer, plus the fill time
        (profiler.sim.roofline)."""
        if cost is None or cost is self.cost:
            if self.cost is None:
                raise RuntimeError("SimDevice.step() before load(): the step's cost is not known")
            if self._times:
                return self._times
            cost = self.cost
        return kernel_times(cost.work, self.config.rates, flops=cost.flops, kernels=max(1, cost.kernels))

    def step_s(self, cost: StepCost | None = None) -> float:
        """Device time of one step's kernels (``cost``, else the loaded one; summed once at load)."""
        if (cost is None or cost is self.cost) and self._times:
            return self._work_s
        return sum(self.kernel_times(cost))

    def launch_total_s(self, cost: StepCost | None = None) -> float:
        """Host time to issue one step (``cost``, else the loaded one): the framework's per-step cost and one
        launch per kernel."""
        cost = cost or self.cost
        return host_s(cost.kernels if cost is not None else 0, self.launch_s, self.framework_s)

    def launch_interval_s(self, cost: StepCost | None = None) -> float:
        """Host time between two of a step's launches: its issue time spread evenly over its kernels."""
        cost = cost or self.cost
        kernels = max(1, cost.kernels if cost is not None else 1)
        return self.launch_total_s(cost) / kernels

    def h2d_s(self, nbytes: int, *, pinned: bool) -> float:
        spec = self.config.spec
        return nbytes / ((spec.h2d_pinned_gbps if pinned else spec.h2d_pageable_gbps) * 1e9)

    def allreduce_s(self, nbytes: int, world: int) -> float:
        """A ring all-reduce of ``nbytes`` over ``world`` devices: each moves ``2 (N-1)/N`` of the bytes over its
        link (``config.link_gbps``) in ``2 (N-1)`` steps of HOP_LATENCY_S; 0 for one device."""
        if world < 2:
            return 0.0
        hops = 2 * (world - 1)
        return hops / world * nbytes / (self.config.link_gbps * 1e9) + hops * HOP_LATENCY_S

    def exposed_allreduce_s(self, world: int, cost: StepCost | None = None) -> float:
        """The part of one step's gradient all-reduce that backward does not hide. DistributedDataParallel
        all-reduces a bucket as soon as backward has produced its gradients, so all but the last bucket overlap
        the rest of backward (BACKWARD_SHARE of the step's device time): ``max(T(grads) - backward, T(last
        bucket))``."""
        cost = cost or self.cost
        if cost is None or world < 2:
            return 0.0
        total = self.allreduce_s(cost.grad_bytes, world)
        last = self.allreduce_s(min(cost.grad_bytes, BUCKET_BYTES), world)
        return max(total - BACKWARD_SHARE * self.step_s(cost), last)

    # -- what the training loop does ------------------------------------------------------------------
    def h2d(self, nbytes: int, *, pinned: bool = False, side_stream: bool = False) -> None:
        """Copy ``nbytes`` host-to-device; blocks the host unless it is a pinned copy on the side stream."""
        d = self.h2d_s(nbytes, pinned=pinned)
        with self._lock:
            now = self.clock()
            if pinned and side_stream:
                start = max(now, self._copy_tail)
                end = self._copy_tail = self._copy_ready = start + d
                self._record(SimOp("copy", "h2d", start, end, nbytes, d, now))
                self._logged(1, 1, start, end, now)
                return
            start = max(now, self._compute_tail)
            end = self._compute_tail = start + d
            self._record(SimOp("compute", "h2d", start, end, nbytes, d, now))
            self._logged(0, 1, start, end, now)
        self.wait_until(end)

    def step(self) -> None:
        """Queue one training step (forward, backward, optimizer) and spend its launch time on the host."""
        work, launch = self.step_s(), self.launch_total_s()
        kernels = max(1, self.cost.kernels if self.cost is not None else 1)
        ahead = max(1, self.queue_limit // kernels)  # steps the launch queue holds
        while True:
            with self._lock:
                now = self.clock()
                while self._in_flight and self._in_flight[0] <= now:
                    self._in_flight.popleft()
                if len(self._in_flight) < ahead:
                    break
                oldest = self._in_flight[0]
            self.wait_until(oldest)
        if self.config.launch == "gil":
            self._step_launched(now)
            return
        with self._lock:
            start = max(now, self._compute_tail, self._copy_ready)
            # launch-bound: no kernel starts before the host has launched it
            end = max(start + work, now + self._lead)
            self._compute_tail = end
            self._in_flight.append(end)
            self.steps += 1
            op = SimOp("compute", "step", start, end, 0, work, now, kernels)
            self._record(op)
            if self._log is not None:
                self._log.extend(_kernels_of(op, self._times, self.launch_interval_s()))
        self.wait_until(now + launch)

    def _step_launched(self, now: float) -> None:
        """``launch=gil``: the host launches the kernels one by one, spending the launch interval of the training
        thread's CPU on each, as eager PyTorch does: the binding's Python part with the GIL held (``GIL_HELD_SHARE``
        of it, a Python loop), then its C++ dispatch with the GIL released (the rest, spent hashing a buffer, which
        releases it), and the GIL taken back to return. On a loaded host a launch takes longer, as a real one does.
        Each kernel starts once launched and once the one before it has ended. A thread beside it that holds the
        GIL (a loader in Python) takes it during the dispatch and keeps it until the training thread's wait for it
        reaches the switch interval (5 ms): the launches crawl, and the device idles. (A release of a microsecond,
        as this model once had, was a race the loader won or lost by the scheduler's timing: the split between
        host and input varied from 46% to 91% host from run to run.)"""
        times, clock, launch_s = self._times, self.clock, self.launch_interval_s()
        work, cpu = self._work_s, time.thread_time
        held_s = launch_s * GIL_HELD_SHARE
        with self._lock:
            at = max(now, self._compute_tail, self._copy_ready)
        first = at
        log: list[tuple[int, int, float, float, float]] | None = [] if self._log is not None else None
        for i, each in enumerate(times):
            start_cpu = cpu()
            target = start_cpu + held_s
            while cpu() < target:
                pass
            _dispatch(start_cpu + launch_s)
            launched = clock()
            start = max(at, launched)
            first = start if i == 0 else first
            at = start + each
            if log is not None:
                log.append((0, 0, start, at, launched))
        with self._lock:
            self._compute_tail = at
            self._in_flight.append(at)
            self.steps += 1
            self._record(SimOp("compute", "step", first, at, 0, work, now, len(times)))
            if self._log is not None and log is not None:
                self._log.extend(log)

    def allreduce(self, world: int, *, not_before: float) -> float:
        """Queue this step's gradient all-reduce on the compute stream, as NCCL does: the host returns at once.
        The kernel starts when the stream reaches it and cannot finish before every rank's backward has
        (``not_before``, a ``clock()`` time the ranks agreed on); its exposed part (:meth:`exposed_allreduce_s`)
        runs after that. Until then it spins waiting for its peers, and NVML counts a spinning kernel as busy,
        so the whole op is busy time (a rank waiting for a straggler reads high utilisation, as on real GPUs).
        Returns when it ends."""
        d = self.exposed_allreduce_s(world)
        with self._lock:
            issued = self.clock()
            start = max(issued, self._compute_tail)
            end = self._compute_tail = max(start, not_before) + d
            start = min(start, end)
            self._record(SimOp("compute", "allreduce", start, end, 0, end - start, issued))
            self._logged(0, 3, start, end, issued)
        return end

    def synchronize(self) -> None:
        """Block the host until everything queued has finished (``torch.cuda.synchronize``)."""
        with self._lock:
            end = max(self._compute_tail, self._copy_tail)
        self.wait_until(end)

    def tail(self) -> float:
        """When the compute stream's queued work ends (now, when it is idle)."""
        with self._lock:
            return max(self.clock(), self._compute_tail)

    def _record(self, op: SimOp) -> None:
        self._ops.append(op)
        self.busy_total_s += op.busy_s if op.kind != "h2d" else 0.0
        self.copied_total += op.nbytes

    def wait_until(self, t: float) -> None:
        """Block the host until ``clock()`` reaches ``t``."""
        while (left := t - self.clock()) > 0:
            self._sleep(left)

    # -- observation (the simulated NVML source, tests) -----------------------------------------------
    def ops(self, since: float = -math.inf) -> list[SimOp]:
        """The operations recorded, oldest first; with ``since``, only those issued after ``since - 60 s`` (an op
        is never queued more than a minute ahead, so every op still running at ``since`` is among them): the
        simulated NVML source reads a window without walking the whole run."""
        with self._lock:
            if since == -math.inf:
                return list(self._ops)
            recent: list[SimOp] = []
            for op in reversed(self._ops):
                if op.end < since - _LOOKBACK_S:
                    break
                recent.append(op)
            return recent[::-1]

    def busy_s(self, t0: float, t1: float) -> float:
        """Seconds within ``[t0, t1)`` during which a kernel executed, a step's or an all-reduce's (what NVML's
        utilisation counts; copies run on the copy engines and do not count). A launch-bound step's kernels are
        spread evenly over it."""
        total = 0.0
        for op in self.ops(since=t0):
            if op.kind == "h2d" or op.end <= t0 or op.start >= t1:
                continue
            overlap = min(op.end, t1) - max(op.start, t0)
            total += overlap * (op.busy_s / (op.end - op.start)) if op.end > op.start else 0.0
        return total

    def copied_bytes(self, t0: float, t1: float) -> float:
        """Host-to-device bytes moved within ``[t0, t1)``, a copy's bytes spread evenly over its duration."""
        total = 0.0
        for op in self.ops(since=t0):
            if op.kind != "h2d" or op.end <= t0 or op.start >= t1:
                continue
            span = op.end - op.start
            total += op.nbytes * ((min(op.end, t1) - max(op.start, t0)) / span) if span > 0 else 0.0
        return total

    def _logged(self, stream: int, kind: int, start: float, end: float, launch: float) -> None:
        if self._log is not None:
            self._log.append((stream, kind, start, end, launch))

    def log_kernels(self, on: bool) -> list[tuple[int, int, float, float, float]]:
        """Start (``on``) or stop keeping each operation as a kernel window sees it: ``(stream, kind, start, end,
        launch)``, clock seconds (stream 0 compute, 1 copy; kind 0 kernel, 1 copy, 3 collective). Returns what was
        kept since the start."""
        with self._lock:
            kept, self._log = self._log or [], [] if on else None
        return kept

    def memory_bytes(self) -> int:
        """Device memory in use: the CUDA context, and the step's tensors once the model is loaded."""
        return CONTEXT_BYTES + (self.cost.memory_bytes if self.cost is not None else 0)

    def timer(self) -> SimTimer:
        return SimTimer(self)


class SimTimer:
    """The Session's device-timer interface over a :class:`SimDevice`: an event is the time at which the
    compute stream reaches it, as a CUDA event recorded on the current stream completes."""

    kind = "sim-events"

    def __init__(self, device: SimDevice) -> None:
        self._dev = device
        self._origin = 0.0

    def bind(self, now: Callable[[], float]) -> None:
        """Put events on the run's timeline: ``now()`` is the run's clock (seconds since its start)."""
        self._origin = self._dev.clock() - now()

    def mark(self) -> float:
        return self._dev.tail()

    def done(self, ev: object) -> bool:
        return bool(self._dev.clock() >= _at(ev))

    def wait(self, ev: object) -> None:
        self._dev.wait_until(_at(ev))

    def time_of(self, ev: object) -> float:
        return _at(ev) - self._origin

    def release(self, ev: object) -> None:
        return None

    def kernel_recorder(self, clock: Callable[[], float]) -> SimKernelRecorder:
        """A kernel-window recorder of this device's operations, on the Session's ``clock``."""
        return SimKernelRecorder(self._dev, clock)


class SimKernelRecorder:
    """The kernel windows of a simulated device (SIMULATED): its operations issued while a window is open."""

    source = "sim"

    def __init__(self, device: SimDevice, clock: Callable[[], float]) -> None:
        self._dev, self._clock = device, clock
        self._offset = 0.0

    def usable(self) -> str | None:
        return None

    def start(self) -> None:
        self._offset = self._dev.clock() - self._clock()
        self._dev.log_kernels(True)

    def stop(self) -> list[tuple[int, int, float, float, float]]:
        off = self._offset
        return [(s, k, a - off, b - off, c - off) for s, k, a, b, c in self._dev.log_kernels(False)]


def _at(ev: object) -> float:
    """The device time of an event :meth:`SimTimer.mark` returned."""
    if not isinstance(ev, (int, float)):
        raise TypeError(f"not a simulated device event: {ev!r}")
    return float(ev)


def _kernels_of(op: SimOp, times: tuple[float, ...], interval: float) -> list[tuple[int, int, float, float, float]]:
    """A ``launch=sleep`` step's kernels (seconds each: ``times``): launched ``interval`` apart from its issue, each
    starting when launched and when the one before it has ended (a launch-bound step shows its gaps)."""
    out = []
    at = op.start
    for i, each in enumerate(times):
        launch = op.issued + (i + 1) * interval
        start = max(at, launch)
        at = start + each
        out.append((0, 0, start, at, launch))
    return out
