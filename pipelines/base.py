"""The contract between a pipeline and the runner.

A pipeline turns a scenario's dataset into batches on the target device. The runner iterates
``loader`` inside ``Session.wrap`` (time blocked there is data wait) and calls ``to_device`` inside the
``h2d`` phase (time blocked there is the copy). A pipeline that copies ahead (prefetch, DALI mixed) makes
``to_device`` cheap: that is exactly the stall it removes, and the breakdown shows it.

``config`` states the loader knobs that were actually in effect (``workers``, ``pin_memory``,
``prefetch_factor``, ...): the analysis quotes them in recommendations, so they must be true.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from pipelines.imagefolder import SkipLog


@dataclass(frozen=True, slots=True)
class LoaderSpec:
    """What the runner asks of a pipeline."""

    batch_size: int
    workers: int = 0
    device: str = "cpu"  # a torch device string: "cpu", "cuda", "cuda:1"
    shuffle: bool = True
    seed: int = 0
    drop_last: bool = True
    # data-parallel training: this rank loads shard ``shard`` of ``num_shards`` (DistributedSampler; DALI's
    # shard_id / num_shards), a disjoint part of every epoch
    shard: int = 0
    num_shards: int = 1
    # DataLoader knobs a run or a tune trial sets (None: the pipeline's own): batches each worker loads ahead,
    # and page-locked batches (on a CUDA device; on a simulated one the copy is modelled from pinned memory)
    prefetch_factor: int | None = None
    pin_memory: bool | None = None

    def __post_init__(self) -> None:
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            raise ValueError(f"prefetch_factor must be >= 1, got {self.prefetch_factor}")
        if not 0 <= self.shard < self.num_shards:
            raise ValueError(f"shard must be in [0, num_shards={self.num_shards}), got {self.shard}")
        if self.workers < 0:
            raise ValueError(f"workers must be >= 0, got {self.workers}")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity: taskset, a cgroup cpuset), which can be fewer than
    the machine's; ``os.cpu_count()`` where affinity is not available (macOS). Loader workers past these only
    contend, unless their items wait rather than compute."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pinned_device(device: str) -> torch.device:
    """``device`` as a ``torch.device``; a bare ``"cuda"`` gets the index of the current CUDA device.

    Threads (the prefetch thread) and DALI (``device_id``) do not share the caller's current device, so a
    pipeline that hands work to them names the device the caller meant, once, at build time.
    """
    import torch  # late: listing pipelines imports this module and must stay cheap

    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda", torch.cuda.current_device())
    return resolved


@dataclass(slots=True)
class BuiltLoader:
    """A ready loader: iterate ``batches``; move each with ``to_device``."""

    batches: Iterable[Any]
    to_device: Any  # Callable[[batch], batch-on-device]
    config: dict[str, Any] = field(default_factory=dict)
    skips: SkipLog | None = None  # image-folder sources: the files left out under --on-bad-sample skip
    # a loader error -> which of the loader's workers failed and how, in one line ("DataLoader worker 1 of 2
    # (pid 123) was killed by SIGKILL"); None for an error that is not a worker's failure
    worker_failure: Callable[[BaseException], str | None] | None = None

    def close(self) -> None:
        """Shut workers down if the loader owns any."""
        closer = getattr(self.batches, "close", None)
        if callable(closer):
            closer()


class Pipeline(Protocol):
    """A named way of turning a dataset into device batches."""

    name: str

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        """Build a loader over ``dataset`` (map-style, items ``(input, target)``)."""
