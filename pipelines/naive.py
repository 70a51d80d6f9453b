"""The ``naive`` pipeline: what most training scripts do, and the baseline the others are compared with.

A plain ``torch.utils.data.DataLoader`` (``spec.workers`` worker processes, pageable memory, workers torn
down after every epoch) and a blocking ``.to(device)`` per batch. Nothing overlaps the copy with compute,
so on CUDA the whole copy shows up in the ``h2d`` phase; that is the stall the other pipelines remove.

Invariants: ``config`` states exactly the knobs passed to the ``DataLoader``; shuffling order and worker
seeds derive from ``spec.seed`` alone (a dedicated ``torch.Generator``, never the global RNG).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

from pipelines.base import BuiltLoader, LoaderSpec
from pipelines.imagefolder import SkipCollate, SkipLog

# The DataLoader default, stated rather than implied so that ``config`` can quote it.
PREFETCH_FACTOR = 2


def move(batch: Any, device: torch.device) -> Any:
    """Copy every tensor in ``batch`` (nested tuples, lists, dicts) to ``device``, blocking."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(move(item, device) for item in batch)
    if isinstance(batch, dict):
        return {key: move(value, device) for key, value in batch.items()}
    return batch


def data_loader(
    dataset: Any, spec: LoaderSpec, *, pin_memory: bool, persistent_workers: bool, prefetch_factor: int | None
) -> tuple[Any, SkipLog | None]:
    """The ``DataLoader`` both torch pipelines build, and the skip log when ``dataset`` reads image files.

    Yields ``(x, y)`` batches either way: an image-folder dataset gets ``SkipCollate`` and a view that strips
    and records the files skipped under ``--on-bad-sample skip``.
    """
    if spec.workers < 0:
        raise ValueError(f"workers must be >= 0, got {spec.workers}")
    if spec.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {spec.batch_size}")
    skips = SkipLog.for_dataset(dataset)
    # a dataset may bring its own collate (detection: a list of per-image targets, not a stacked tensor)
    collate = getattr(dataset, "collate_fn", None)
    loader: DataLoader[Any] = DataLoader(
        dataset,
        batch_size=spec.batch_size,
        shuffle=spec.shuffle,
        num_workers=spec.workers,
        pin_memory=pin_memory,
        drop_last=spec.drop_last,
        persistent_workers=persistent_workers and spec.workers > 0,
        prefetch_factor=prefetch_factor if spec.workers else None,
        generator=torch.Generator().manual_seed(spec.seed),
        collate_fn=SkipCollate(collate) if skips is not None else collate,
    )
    return (skips.wrap(loader) if skips is not None else loader), skips


class NaivePipeline:
    """``DataLoader`` with pageable memory and a blocking copy."""

    name = "naive"

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        device = torch.device(spec.device)
        prefetch_factor = PREFETCH_FACTOR if spec.workers else None
        batches, skips = data_loader(
            dataset, spec, pin_memory=False, persistent_workers=False, prefetch_factor=prefetch_factor
        )

        def to_device(batch: Any) -> Any:
            return move(batch, device)

        return BuiltLoader(
            batches=batches,
            to_device=to_device,
            config={
                "pipeline": self.name,
                "workers": spec.workers,
                "pin_memory": False,
                "prefetch_factor": prefetch_factor,
                "persistent_workers": False,
            },
            skips=skips,
        )
