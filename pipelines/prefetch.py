"""The ``prefetch`` pipeline: the same dataset as ``naive``, loaded the way a tuned training script does.

What differs from ``naive``:

- the ``DataLoader`` keeps its workers between epochs (``persistent_workers``) and, on CUDA, pins its
  batches (``pin_memory``), so the copy can be asynchronous;
- a background thread (one per epoch, ``stallscope-prefetch``) pulls batches from the ``DataLoader``
  iterator up to ``depth`` batches ahead of the consumer, so the next batch loads while the current step
  computes. With ``workers=0`` this thread is the only overlap there is;
- on CUDA the same thread issues each batch's copy on a side stream (``non_blocking`` from pinned memory)
  and records an event after it; when the batch is handed over, the consumer's stream waits on that event
  and every tensor is ``record_stream``-ed on the consumer's stream, so the caching allocator cannot reuse
  its memory while the step still reads it. The CUDA calls stand behind ``_Copier`` (``start`` in the
  thread, ``finish`` in the consumer) so tests drive the logic with a fake stream and event.

So the batch is already where it has to be when it is handed over (both copiers move every tensor the
traversal finds, ``naive.map_tensors``): ``to_device`` returns the batch as is and the ``h2d`` phase is
near zero; that is the stall this pipeline removes, and the breakdown shows it.

Invariants:
- ``batches`` is re-iterable: one ``iter()`` per epoch; the previous epoch's thread is stopped and joined
  before the ``DataLoader`` iterator is reset, so two threads never drive one iterator.
- Batches arrive in the ``DataLoader``'s order, and the same seed gives the same batches as ``naive`` in
  every epoch (persistent workers would otherwise shift the shuffle from the second epoch on: see
  ``__iter__``).
- An exception raised while loading or copying a batch (in a worker process or in the thread) is carried
  across the thread and re-raised, with its own type and message, where that batch would have been
  delivered; the batches before it are delivered first.
- Every blocking call (queue get, slot acquire, join) has a timeout and checks a stop event, so a
  closed or abandoned epoch stops its thread within ``_POLL_S`` plus the batch load in progress.
- ``close()`` stops the thread and shuts the persistent workers down: a run leaves no child process.
- ``config`` states exactly the knobs in effect.
- With persistent workers, the workers keep the dataset copy they started with, so a ``set_epoch`` in the
  main process would not reach them; ``_EpochRelay`` carries the epoch through shared memory, keeping
  "item i at epoch e is the same for any worker count" (the scenarios' invariant) true here too.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from pipelines.base import BuiltLoader, LoaderSpec, pinned_device
from pipelines.imagefolder import StrippedBatches
from pipelines.naive import data_loader, map_tensors, move, watched_loader

log = logging.getLogger(__name__)

DEPTH = 2  # batches loaded ahead of the consumer
THREAD_NAME = "stallscope-prefetch"
_POLL_S = 0.05  # how often a blocked get/acquire looks at the stop event
_JOIN_S = 10.0  # how long a stop waits for the batch the thread is loading (a dataset call cannot be interrupted)


# -- copiers: where the batch goes between loading and hand-over ------------------------------------------


class _Copier(Protocol):
    """``start`` runs in the prefetch thread right after loading; ``finish`` in the consumer at hand-over."""

    def start(self, batch: Any) -> Any: ...

    def finish(self, pending: Any) -> Any: ...


class _HostCopier:
    """Non-CUDA devices: the copy is a plain ``.to`` done ahead in the thread (a no-op on CPU)."""

    def __init__(self, device: torch.device) -> None:
        self._device = device

    def start(self, batch: Any) -> Any:
        return move(batch, self._device)

    def finish(self, pending: Any) -> Any:
        return pending


@dataclass(frozen=True, slots=True)
class _Pending:
    batch: Any  # device tensors whose copy may still be running on the side stream
    copied: Any  # the CUDA event recorded on the side stream after the copy
    tensors: list[torch.Tensor]  # every device tensor in ``batch``, for record_stream at hand-over


class _CudaCopier:
    """Side-stream copies. ``cuda`` is ``torch.cuda`` or, in tests, a fake with the same few names."""

    def __init__(self, device: torch.device, cuda: Any = None) -> None:
        self._cuda = torch.cuda if cuda is None else cuda
        self._device = device
        self._stream = self._cuda.Stream(device=device)

    def start(self, batch: Any) -> _Pending:
        # The thread's current device and stream are its own (thread-local): set both for this copy.
        tensors: list[torch.Tensor] = []

        def copy(t: torch.Tensor) -> torch.Tensor:
            moved = t.to(self._device, non_blocking=True)
            tensors.append(moved)
            return moved

        with self._cuda.device(self._device), self._cuda.stream(self._stream):
            batch = map_tensors(batch, copy)
            copied = self._cuda.Event()
            copied.record(self._stream)
        return _Pending(batch, copied, tensors)

    def finish(self, pending: _Pending) -> Any:
        consumer = self._cuda.current_stream(self._device)
        # Device-side wait: the host does not block; the step's kernels queue behind the copy.
        consumer.wait_event(pending.copied)
        for t in pending.tensors:
            # The memory was allocated on the side stream; without this the allocator could hand it out
            # again as soon as the batch is dropped, while the consumer stream still reads it.
            t.record_stream(consumer)
        return pending.batch


# -- the per-epoch prefetch thread ------------------------------------------------------------------------

_END = object()  # the epoch ended (StopIteration in the thread, or a stop)


@dataclass(frozen=True, slots=True)
class _Failure:
    """An exception raised in the thread, carried to the consumer and re-raised there."""

    error: BaseException


class _Feeder:
    """One epoch: a daemon thread pulling from ``source`` at most ``depth`` batches ahead of ``take()``."""

    def __init__(self, source: Iterator[Any], start: Callable[[Any], Any], depth: int) -> None:
        self._source: Iterator[Any] | None = source
        self._start = start
        # A slot is taken before a batch is loaded and given back when the consumer takes one, so at most
        # ``depth`` batches (host or device memory) are ever loaded ahead. The slots are the bound: every put
        # follows an acquire, so the queue needs none of its own and a put never blocks.
        self._slots = threading.Semaphore(depth)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    # thread side
    def _run(self) -> None:
        source = self._source
        assert source is not None
        try:
            while self._acquire_slot():
                try:
                    batch = next(source)
                except StopIteration:
                    self._put(_END)
                    return
                self._put(self._start(batch))
        except BaseException as exc:  # noqa: BLE001 - not swallowed: the consumer re-raises it where this batch was due
            self._put(_Failure(exc))
        finally:
            # Close a generator source here, in the thread that ran it (another thread may not close it),
            # so the DataLoader iterator it holds is released with the epoch.
            self._source = None
            closer = getattr(source, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception as exc:  # noqa: BLE001 - the epoch is over either way; the error is worth a line, no more
                    log.warning("stallscope prefetch: closing the batch source failed: %s", exc)

    def _acquire_slot(self) -> bool:
        while not self._stop.is_set():
            if self._slots.acquire(timeout=_POLL_S):
                return True
        return False

    def _put(self, item: Any) -> None:
        if not self._stop.is_set():  # once stopped, nobody takes it: do not hold its memory
            self._queue.put_nowait(item)

    # consumer side
    def take(self) -> Any:
        """The next batch, ``_END``, or a ``_Failure``; ``_END`` once stopped."""
        while True:
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                if self._stop.is_set():
                    return _END
                # is_alive before empty: a thread that put its last item and exited is not a lost result
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the prefetch thread ended without delivering a batch or an error") from None
                continue
            self._slots.release()
            return item

    def stop(self, timeout: float = _JOIN_S) -> bool:
        """Stop the thread and drop what it loaded; True when it has exited."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
        while True:  # release the queued batches (pinned or device memory) now, not at garbage collection
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        return not self._thread.is_alive()


@dataclass(slots=True)
class _EpochStart:
    """The loader's generator as an epoch began, and how many of its batches the consumer took."""

    state: torch.Tensor
    taken: int = 0
    finished: bool = False  # the consumer reached the epoch's end


def _align_generator(loader: Any, last: _EpochStart) -> None:
    """After an epoch the consumer abandoned, put the loader's generator where ``naive``'s would be.

    ``RandomSampler`` draws once more from the generator when its iterator is advanced past the last index.
    ``naive``'s DataLoader asks its sampler for the batches taken plus those in flight (``prefetch_factor`` x
    workers; none with 0 workers); the prefetch thread reads further ahead, and reached the end or not by chance
    (one epoch in five beside busy processes), which shifted the next epoch's order. So the generator is reset to
    the abandoned epoch's start and the requests ``naive`` made are replayed: its base seed, then the sampler.
    """
    sampler = getattr(loader, "sampler", None)
    if not isinstance(sampler, torch.utils.data.RandomSampler) or sampler.generator is not loader.generator:
        return  # the generator orders nothing else
    loader.generator.set_state(last.state)
    torch.empty((), dtype=torch.int64).random_(generator=loader.generator)  # the base seed every iter() draws
    in_flight = loader.prefetch_factor * loader.num_workers if loader.num_workers else 0
    requests = iter(loader.batch_sampler if loader.batch_sampler is not None else sampler)
    for _ in range(last.taken + in_flight):
        if next(requests, None) is None:
            break


# -- persistent workers and set_epoch ---------------------------------------------------------------------


class _EpochRelay:
    """A dataset view that applies the main process's epoch in persistent workers.

    The runner calls ``set_epoch`` on its own dataset object; a persistent worker holds a copy made when it
    started. ``publish()`` (main process, before each epoch) writes the dataset's ``epoch`` into one
    shared-memory integer; each worker's copy calls ``set_epoch`` when it sees the value change.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset
        self._shared = torch.zeros((), dtype=torch.int64).share_memory_()  # type: ignore[no-untyped-call]
        self._applied: int | None = None
        self.publish()

    @property
    def source(self) -> Any:
        # image-folder datasets are recognised by ``source`` (SkipLog.for_dataset): keep it visible
        return getattr(self.dataset, "source", None)

    def publish(self) -> None:
        self._shared.fill_(int(self.dataset.epoch))

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        epoch = int(self._shared.item())
        if epoch != self._applied:
            self.dataset.set_epoch(epoch)
            self._applied = epoch
        return self.dataset[index]


def _relays_epoch(dataset: Any) -> bool:
    return callable(getattr(dataset, "set_epoch", None)) and isinstance(getattr(dataset, "epoch", None), int)


# -- the re-iterable batches ------------------------------------------------------------------------------


class PrefetchBatches:
    """``DataLoader`` batches delivered through a prefetch thread; one pass per ``iter()`` (epoch)."""

    def __init__(
        self,
        loader: Any,
        copier: _Copier,
        depth: int,
        *,
        relay: _EpochRelay | None = None,
        workers: int = 0,
        pin_memory: bool = False,
        batch_size: int | None = None,
    ) -> None:
        self._loader = loader
        self._copier = copier
        self._depth = depth
        self._relay = relay
        self._feeder: _Feeder | None = None
        self._epoch = 0  # iter() calls so far: a pass started by an older iter() must not run
        self._last: _EpochStart | None = None  # the latest epoch's start, for _align_generator
        # what Session.wrap notes from a DataLoader it is handed, stated here since it sees this object
        self.num_workers = workers
        self.pin_memory = pin_memory
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        if not self._stop_feeder():
            raise RuntimeError(
                f"the previous epoch's prefetch thread is still loading a batch after {_JOIN_S:g} s: "
                "cannot start a new epoch on the same DataLoader iterator"
            )
        if self._relay is not None:
            self._relay.publish()  # before iter(): that is where persistent workers get this epoch's indices
        loader = self._dataloader()
        if self._last is not None and not self._last.finished:
            _align_generator(loader, self._last)
        self._last = _EpochStart(loader.generator.get_state()) if loader.generator is not None else None
        if getattr(loader, "_iterator", None) is not None and loader.generator is not None:
            # A non-persistent DataLoader draws a base seed from its generator at every iter(), then the
            # shuffle; a persistent one draws the seed once. Draw it here too, so epoch e's shuffle order
            # is the one naive gets from the same seed.
            torch.empty((), dtype=torch.int64).random_(generator=loader.generator)
        self._epoch += 1
        return self._deliver(iter(self._loader), self._epoch, self._last)

    def _deliver(self, source: Iterator[Any], epoch: int, start: _EpochStart | None) -> Generator[Any, None, None]:
        # The thread starts on the first next(), not in iter(): a generator never started never runs its
        # finally, so a thread started in iter() and never consumed would outlive its epoch.
        if epoch != self._epoch:
            return  # a newer iter() has reset the DataLoader iterator: this pass is over
        feeder = self._feeder = _Feeder(source, self._copier.start, self._depth)
        del source  # the thread owns it now (and closes it)
        try:
            while True:
                item = feeder.take()
                if item is _END:
                    if start is not None:
                        start.finished = True
                    return
                if isinstance(item, _Failure):
                    item.error.add_note("(raised while prefetching this batch: stallscope pipeline 'prefetch')")
                    raise item.error
                if start is not None:
                    start.taken += 1
                yield self._copier.finish(item)
        finally:
            # epoch end, an error, or the consumer abandoning the loop (GeneratorExit)
            feeder.stop()

    def _stop_feeder(self) -> bool:
        feeder, self._feeder = self._feeder, None
        if feeder is None or feeder.stop():
            return True
        log.warning("stallscope prefetch: thread still loading a batch after %g s; left to finish as a daemon", _JOIN_S)
        return False

    def _dataloader(self) -> Any:
        return self._loader.loader if isinstance(self._loader, StrippedBatches) else self._loader

    def close(self) -> None:
        """Stop the prefetch thread and shut persistent workers down; a later ``iter()`` starts afresh."""
        self._epoch += 1  # a pass created but not yet started must not start a thread after this
        self._stop_feeder()
        loader = self._dataloader()
        iterator = getattr(loader, "_iterator", None)  # where a DataLoader keeps its persistent workers
        if iterator is None:
            return
        loader._iterator = None
        shutdown = getattr(iterator, "_shutdown_workers", None)  # private, but the only prompt way to stop them
        if callable(shutdown):
            shutdown()


# -- the pipeline -----------------------------------------------------------------------------------------


class PrefetchPipeline:
    """Persistent (pinned on CUDA) ``DataLoader`` + a prefetch thread + side-stream copies on CUDA."""

    name = "prefetch"
    # how batches reach an accelerator, for the simulated device: pinned memory, copied ahead on a side stream
    accelerator_copy = "pinned-async"

    def __init__(self, depth: int = DEPTH) -> None:
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.depth = depth

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        # the prefetch thread's current device is its own: pin the consumer's now
        device = pinned_device(spec.device)
        on_cuda = device.type == "cuda"
        relay = _EpochRelay(dataset) if spec.workers > 0 and _relays_epoch(dataset) else None
        if spec.workers > 0 and relay is None and callable(getattr(dataset, "set_epoch", None)):
            log.warning(
                "stallscope prefetch: %s has set_epoch but no integer 'epoch' attribute: persistent workers "
                "will not see later epochs",
                type(dataset).__name__,
            )
        loader, skips, knobs = data_loader(
            relay if relay is not None else dataset, spec, pin_memory=on_cuda, persistent_workers=True
        )
        copier: _Copier = _CudaCopier(device) if on_cuda else _HostCopier(device)
        batches = PrefetchBatches(
            loader,
            copier,
            self.depth,
            relay=relay,
            workers=spec.workers,
            pin_memory=bool(knobs["pin_memory"]),
            batch_size=spec.batch_size,
        )
        return BuiltLoader(
            batches=batches,
            to_device=_already_there,
            config={
                "pipeline": self.name,
                **knobs,
                "device_prefetch": "cuda-side-stream" if on_cuda else "cpu-thread",
                "depth": self.depth,
            },
            skips=skips,
            worker_failure=watched_loader(loader).worker_failure,
        )


def _already_there(batch: Any) -> Any:
    """``to_device`` for prefetched batches: a copier moved every tensor to the device before hand-over."""
    return batch
