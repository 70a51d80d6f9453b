"""The ``naive`` pipeline: what most training scripts do, and the baseline the others are compared with.

A plain ``torch.utils.data.DataLoader`` (``spec.workers`` worker processes, pageable memory, workers torn
down after every epoch) and a blocking ``.to(device)`` per batch. Nothing overlaps the copy with compute,
so on CUDA the whole copy shows up in the ``h2d`` phase; that is the stall the other pipelines remove.

Invariants: ``config`` states exactly the knobs passed to the ``DataLoader``; shuffling order and worker
seeds derive from ``spec.seed`` alone (a dedicated ``torch.Generator``, never the global RNG). A worker
process that dies (SIGKILL from the kernel's out-of-memory killer, a crash in native code) or raises is named
in one line by ``WatchedLoader.worker_failure``: its index, its pid and how it ended, which torch's own
messages do not say together (a death gives the pid alone, an exception the index and a whole traceback).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing.queues as mp_queues
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from types import TracebackType
from typing import Any

import torch
from torch.utils.data import DataLoader, DistributedSampler, default_collate

from pipelines import stages
from pipelines.base import BuiltLoader, LoaderSpec
from pipelines.imagefolder import SkipCollate, SkipLog, StrippedBatches

# The DataLoader default, stated rather than implied so that ``config`` can quote it.
PREFETCH_FACTOR = 2


def map_tensors(batch: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``batch`` with ``fn`` applied to every tensor in it (nested tuples, named tuples, lists, dicts)."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_tensors(item, fn) for item in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(map_tensors(item, fn) for item in batch)
    if isinstance(batch, dict):
        return {key: map_tensors(value, fn) for key, value in batch.items()}
    return batch


def tensor_bytes(batch: Any) -> int:
    """Bytes of every tensor in ``batch`` (the tensors ``map_tensors`` visits): what a copy to the device moves."""
    sizes: list[int] = []

    def count(t: torch.Tensor) -> torch.Tensor:
        sizes.append(t.element_size() * t.numel())
        return t

    map_tensors(batch, count)
    return sum(sizes)


def move(batch: Any, device: torch.device) -> Any:
    """Copy every tensor in ``batch`` (nested tuples, lists, dicts) to ``device``, blocking."""
    return map_tensors(batch, lambda t: t.to(device))


# torch's messages for a worker that died: "DataLoader worker (pid 123) is killed by signal: Killed.",
# "... (pid 123) exited unexpectedly with exit code 1", "... (pid(s) 123, 456) exited unexpectedly"
_DEAD_WORKER = re.compile(r"DataLoader worker \(pids?(?:\(s\))? ([\d, ]+)\)")
# torch's message for an exception raised in a worker: "Caught ValueError in DataLoader worker process 1." then
# the worker's traceback, whose frames read 'File "/path/data.py", line 12, in __getitem__'
_RAISED = re.compile(r"Caught \w+ in DataLoader worker process (\d+)\.")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
# how long a lost connection to a worker waits for that worker's exit status (a SIGKILLed one is reaped at once)
DEAD_WORKER_WAIT_S = 1.0


def how_it_ended(exitcode: int | None) -> str:
    """A worker process's exit code in words: "was killed by SIGKILL", "exited with code 1"."""
    if exitcode is None:
        return "exited unexpectedly"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        oom = " (the kernel's out-of-memory killer sends SIGKILL: see `dmesg`)" if exitcode == -signal.SIGKILL else ""
        return f"was killed by {name}{oom}"
    return f"exited with code {exitcode}"


def _quiet_worker_threads(worker_id: int) -> None:
    """``worker_init_fn``: in a worker, drop the traceback multiprocessing's resource-sharer thread prints (through
    ``sys.excepthook``) when the main process stops reading mid-transfer, as it does when another worker died:
    the main process reports that death in one line, and a second process's traceback on the same stderr only
    hides it. Any other error still reaches the hook as before. A batch the worker's queue thread cannot send
    (shared memory full: the batch is dropped, and the main process names the cause) is one line, not the
    traceback multiprocessing prints for it."""
    mp_queues.Queue._on_queue_feeder_error = staticmethod(partial(_unsent_batch, worker_id))  # type: ignore[attr-defined]
    default = sys.excepthook

    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        sharer = threading.current_thread().name.endswith("(_serve)")  # resource_sharer's Thread(target=_serve)
        if sharer and issubclass(exc_type, (OSError, EOFError)):
            return
        default(exc_type, exc, tb)

    sys.excepthook = hook


def _unsent_batch(worker_id: int, exc: Exception, _obj: object) -> None:
    """One line for a batch a worker's queue thread could not send (in place of multiprocessing's traceback)."""
    sys.stderr.write(
        f"stallscope: DataLoader worker {worker_id} (pid {os.getpid()}) could not send a batch: "
        f"{type(exc).__name__}: {exc}\n"
    )
    sys.stderr.flush()


@contextlib.contextmanager
def inherited_garbage_frozen(workers: int) -> Iterator[None]:
    """While ``DataLoader`` forks its ``workers``, no garbage of this process is left for them to collect.

    A forked worker inherits the main process's uncollected garbage (objects in reference cycles) and, left alone,
    collects it at its first collection, running the destructors of the main process's objects in the worker. A
    CUDA event's destructor there calls CUDA, which a forked process cannot use: the worker aborts ("CUDA error:
    initialization error", then "DataLoader worker ... killed by signal: Aborted"; seen on an H100,
    docs/benchmarks.md "GPU check"). Every tracked object is frozen (``gc.freeze``) for the fork: a worker never
    collects a frozen object, and the main process unfreezes them at once. Where a caller froze objects of its own,
    unfreezing would undo that, so the garbage is collected before the fork instead.
    """
    if workers <= 0:
        yield
        return
    if gc.get_freeze_count() > 0:
        gc.collect()
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class WatchedLoader(DataLoader[Any]):
    """A ``DataLoader`` that keeps the worker processes of its latest pass, so that a worker's death can be
    told by worker index, pid and exit status (torch's message gives the pid alone, and no worker index)."""

    def __iter__(self) -> Any:
        with inherited_garbage_frozen(self.num_workers):
            it = super().__iter__()  # forks this pass's workers (persistent ones: the first pass only)
        # a private attribute, read defensively: the worker processes of this pass, by worker id
        self._watched: list[Any] = list(getattr(it, "_workers", None) or [])
        return it

    def worker_failure(self, exc: BaseException) -> str | None:
        """One line naming the worker when ``exc`` is torch's error for a worker that died ("DataLoader worker 1
        of 2 (pid 123) was killed by SIGKILL") or raised ("DataLoader worker 1 of 2 (pid 123) raised ValueError:
        ... (at data.py:12 in __getitem__)", where torch's message holds the worker's whole traceback); None for
        any other exception."""
        procs = {w.pid: (i, w) for i, w in enumerate(getattr(self, "_watched", []))}
        if isinstance(exc, (ConnectionError, EOFError)):
            # the main process can lose the connection to a dying worker (mid-transfer) before torch's SIGCHLD
            # handler raises its own error: then the worker that ended is the failure
            return _ended_worker(procs)
        raised = _RAISED.search(str(exc))
        if raised is not None:
            return _raised(int(raised.group(1)), str(exc), procs)
        found = _DEAD_WORKER.search(str(exc))
        if found is None:
            return None
        pids = [int(p) for p in found.group(1).replace(",", " ").split()]
        told = []
        for pid in pids:
            if pid not in procs:
                told.append(f"DataLoader worker (pid {pid}) exited unexpectedly")
                continue
            index, proc = procs[pid]
            told.append(f"DataLoader worker {index} of {len(procs)} (pid {pid}) {how_it_ended(proc.exitcode)}")
        return "; ".join(told)


def _ended_worker(procs: dict[int, tuple[int, Any]], wait_s: float = DEAD_WORKER_WAIT_S) -> str | None:
    """The workers of ``procs`` that ended with a signal or a non-zero code, in one line, waiting up to ``wait_s``
    for a dying worker to be reaped; None when every worker is alive (the error was not a worker's death)."""
    deadline = time.monotonic() + wait_s
    while True:
        ended = [(i, pid, w.exitcode) for pid, (i, w) in sorted(procs.items()) if w.exitcode not in (None, 0)]
        if ended or time.monotonic() >= deadline:
            break
        try:
            time.sleep(0.02)
        except RuntimeError as exc:  # torch's SIGCHLD handler announcing the death waited for: poll on
            if _DEAD_WORKER.search(str(exc)) is None:
                raise
    told = [f"DataLoader worker {i} of {len(procs)} (pid {pid}) {how_it_ended(code)}" for i, pid, code in ended]
    return "; ".join(told) or None


def _raised(index: int, message: str, procs: dict[int, tuple[int, Any]]) -> str:
    """torch's "Caught X in DataLoader worker process N. Original Traceback ..." as one line: the worker, the
    traceback's last line (the error) and its innermost frame."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    frames = [f for ln in lines if (f := _FRAME.match(ln)) is not None]
    error = lines[-1] if len(lines) > 1 else message
    where = (
        f" (at {os.path.basename(frames[-1].group(1))}:{frames[-1].group(2)} in {frames[-1].group(3)})"
        if frames
        else ""
    )
    pid = next((f" (pid {pid})" for pid, (i, _) in procs.items() if i == index), "")
    return f"DataLoader worker {index} of {len(procs) or '?'}{pid} raised {error}{where}"


class EpochShards(DistributedSampler[Any]):
    """A ``DistributedSampler`` that moves to the next epoch by itself at every ``iter()``, as a shuffling
    DataLoader does: the loop need not call ``set_epoch``, and every rank draws the same permutation of the
    epoch (seeded by ``spec.seed``) and keeps its own disjoint shard of it."""

    def __iter__(self) -> Any:
        it = super().__iter__()
        self.set_epoch(self.epoch + 1)
        return it


def data_loader(
    dataset: Any, spec: LoaderSpec, *, pin_memory: bool, persistent_workers: bool
) -> tuple[Any, SkipLog | None, dict[str, Any]]:
    """The ``DataLoader`` both torch pipelines build, the skip log when ``dataset`` reads image files, and the
    knobs in effect (``workers``, ``pin_memory``, ``prefetch_factor``, ``persistent_workers``) for ``config``.

    Yields ``(x, y)`` batches either way: an image-folder dataset gets ``SkipCollate`` and a view that strips
    and records the files skipped under ``--on-bad-sample skip``. The ``DataLoader`` is a ``WatchedLoader``
    (``watched_loader`` finds it behind the view).
    """
    knobs: dict[str, Any] = {
        "workers": spec.workers,
        "pin_memory": pin_memory if spec.pin_memory is None else spec.pin_memory,
        "prefetch_factor": (spec.prefetch_factor or PREFETCH_FACTOR) if spec.workers else None,
        "persistent_workers": persistent_workers and spec.workers > 0,
    }
    skips = SkipLog.for_dataset(dataset)
    # a dataset may bring its own collate (detection: a list of per-image targets, not a stacked tensor); timed as
    # the collate stage where a stallscope run installed the stage clock (pipelines.stages)
    collate = getattr(dataset, "collate_fn", None)
    if stages.installed():
        collate = stages.TimedCollate(collate if collate is not None else default_collate)
    sampler = (
        EpochShards(dataset, spec.num_shards, spec.shard, shuffle=spec.shuffle, seed=spec.seed, drop_last=True)
        if spec.num_shards > 1
        else None
    )
    if sampler is not None:
        knobs["shard"] = f"{spec.shard} of {spec.num_shards} (DistributedSampler)"
    loader = WatchedLoader(
        dataset,
        batch_size=spec.batch_size,
        shuffle=spec.shuffle if sampler is None else None,
        sampler=sampler,
        num_workers=knobs["workers"],
        # page-locked memory needs an accelerator: on the host (a simulated device's batches stay there) torch would
        # warn and not pin; the simulated device models the pinned copy from the knob instead
        pin_memory=knobs["pin_memory"] and torch.device(spec.device).type == "cuda",
        drop_last=spec.drop_last,
        persistent_workers=knobs["persistent_workers"],
        prefetch_factor=knobs["prefetch_factor"],
        generator=torch.Generator().manual_seed(spec.seed),
        collate_fn=SkipCollate(collate) if skips is not None else collate,
        worker_init_fn=_quiet_worker_threads if spec.workers else None,
    )
    return (skips.wrap(loader) if skips is not None else loader), skips, knobs


def watched_loader(batches: Any) -> WatchedLoader:
    """The ``WatchedLoader`` that ``data_loader`` built, behind the skip view if there is one."""
    loader = batches.loader if isinstance(batches, StrippedBatches) else batches
    assert isinstance(loader, WatchedLoader)
    return loader


class NaivePipeline:
    """``DataLoader`` with pageable memory and a blocking copy."""

    name = "naive"
    # how batches reach an accelerator, for the simulated device: a blocking copy from pageable memory
    accelerator_copy = "pageable"

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        batches, skips, knobs = data_loader(dataset, spec, pin_memory=False, persistent_workers=False)
        return BuiltLoader(
            batches=batches,
            to_device=partial(move, device=torch.device(spec.device)),
            config={"pipeline": self.name, **knobs},
            skips=skips,
            worker_failure=watched_loader(batches).worker_failure,
        )
