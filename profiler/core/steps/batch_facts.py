"""What a loop's batches and loader say of themselves: how many items a batch holds, and a DataLoader's knobs.

Shared by the Session (its hot path counts each batch), the framework integrations and the head-space driver; it
imports nothing of the project.
"""

from __future__ import annotations

from typing import Any


def batch_len(batch: Any) -> int | None:
    """Items in a batch: leading dim of the first tensor-like found; None when it cannot be told."""
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return int(shape[0])
        if isinstance(batch, (list, tuple)) and batch:
            first = batch[0]
            if not (hasattr(first, "shape") or isinstance(first, (list, tuple, dict))):
                return len(batch)  # a batch of plain items
            batch = first
        elif isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        else:
            return None
    return None


class BatchLen:
    """:func:`batch_len` for a loop's batches, with the way to the first batch's length kept when it was a tensor's
    leading dim (the batch itself, or the first of a tuple or list of them): a batch of the same types is then
    counted with one ``len`` (the hot path), anything else by :func:`batch_len`."""

    __slots__ = ("_inner", "_outer")

    def __init__(self) -> None:
        self._outer: type | None = None
        self._inner: type | None = None  # the first element's type (None: the batch is the tensor)

    def __call__(self, batch: Any) -> int | None:
        outer = type(batch)
        if outer is self._outer:
            inner: Any = self._inner
            # shape[0], not len(): a tensor's __len__ is Python code of torch's, a few us more on a cold hot path
            try:
                if inner is None:
                    return int(batch.shape[0])
                first: Any = batch[0] if batch else None
                if type(first) is inner:
                    return int(first.shape[0])
            except (TypeError, IndexError):  # a 0-d tensor
                pass
            return batch_len(batch)
        n = batch_len(batch)
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            self._outer, self._inner = outer, None
        elif isinstance(batch, (list, tuple)) and batch:
            first = getattr(batch[0], "shape", None)
            if first is not None and len(first) > 0:
                self._outer, self._inner = outer, type(batch[0])
        return n


def loader_facts(loader: Any) -> dict[str, object]:
    """``workers``, ``pin_memory`` and ``batch_size`` of a DataLoader-like object, those it has."""
    return {
        key: getattr(loader, attr)
        for key, attr in (("workers", "num_workers"), ("pin_memory", "pin_memory"), ("batch_size", "batch_size"))
        if isinstance(getattr(loader, attr, None), (int, bool))
    }
