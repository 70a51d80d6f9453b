"""Pieces the built-in scenarios share: a base for their synthetic datasets, their loss, Keras's initialisation."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset

# The seed stream of the label order, and of the per-epoch augmentation draws (kept from when each dataset
# had its own copy, so that every item is bit-identical to what earlier versions produced).
_LABEL_STREAM = 0x1AB
_AUGMENT_STREAM = 0xA46


class SeededItems(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A synthetic map-style dataset whose item ``i`` is a pure function of ``(seed, i)``.

    Holds what the built-in synthetic datasets share: argument checks, ``len``, and a balanced label set in a
    seeded order (every class equally frequent for any length that is a multiple of ``num_classes``). An
    item's own generator is :meth:`item_rng`, never the global or a per-worker RNG, so an item is the same
    whatever the worker count or access order.
    """

    def __init__(self, length: int, *, seed: int, num_classes: int) -> None:
        if length < 1:
            raise ValueError(f"length must be >= 1, got {length}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.length = length
        self.seed = seed
        self._labels = np.random.default_rng([seed, _LABEL_STREAM]).permutation(np.arange(length) % num_classes)

    def __len__(self) -> int:
        return self.length

    def label(self, index: int) -> int:
        """The label of item ``index``; IndexError outside ``0..length-1``."""
        if not 0 <= index < self.length:
            raise IndexError(f"index {index} out of range for length {self.length}")
        return int(self._labels[index])

    def item_rng(self, index: int) -> np.random.Generator:
        """The generator of item ``index``'s content (fixed by ``(seed, index)``)."""
        return np.random.default_rng([self.seed, index])


class AugmentedItems(SeededItems):
    """A :class:`SeededItems` whose items are augmented per epoch: item ``i`` at epoch ``e`` is fixed by
    ``(seed, i, e)``. ``augment_epochs`` is Keras's "augment the first N epochs, then train on plain data"
    (``--augment-epochs``); None augments every epoch."""

    def __init__(self, length: int, *, seed: int, num_classes: int, augment: bool, epoch: int) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        super().__init__(length, seed=seed, num_classes=num_classes)
        self.augment = augment
        self.augment_epochs: int | None = None
        self.epoch = epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation draw: item ``i`` at epoch ``e`` is fixed by ``(seed, i, e)``."""
        self.epoch = epoch

    @property
    def augmenting(self) -> bool:
        """Whether items of the current epoch are augmented."""
        return self.augment and (self.augment_epochs is None or self.epoch < self.augment_epochs)

    def augment_rng(self, index: int) -> np.random.Generator:
        """The generator of item ``index``'s augmentation at the current epoch."""
        return np.random.default_rng([self.seed, index, self.epoch, _AUGMENT_STREAM])


def draw_bank(
    seed: int, tag: int, draw: Callable[[int, np.random.Generator], np.ndarray], *, classes: int, variants: int
) -> np.ndarray:
    """``[classes, variants, ...]`` templates: ``draw(label, rng)`` class by class, all from one generator
    seeded by ``(seed, tag)`` (``tag`` keeps each dataset's bank stream apart)."""
    rng = np.random.default_rng([seed, tag])
    return np.stack([np.stack([draw(c, rng) for _ in range(variants)]) for c in range(classes)])


def shared_read_only(build: Callable[[int], np.ndarray]) -> functools._lru_cache_wrapper[np.ndarray]:
    """Decorate ``build(seed)`` to run once per process and seed (the last 4 seeds kept) and return its array
    read-only, so that every dataset of that seed shares it; ``cache_clear()`` drops the cache."""

    @functools.lru_cache(maxsize=4)
    @functools.wraps(build)
    def shared(seed: int) -> np.ndarray:
        array = build(seed)
        array.flags.writeable = False
        return array

    return shared


def cross_entropy(output: Any, target: Any) -> Any:
    """The classification scenarios' loss: mean softmax cross entropy over the batch."""
    return F.cross_entropy(output, target)


def keras_init(model: nn.Module) -> nn.Module:
    """Keras's default initialisation: Glorot-uniform weights and zero biases for every conv and dense layer.

    Torch's default (Kaiming-uniform with a=sqrt(5)) starts the seeds' BatchNorm-free nets with small
    activations, and with the runner's plain SGD the loss then sits at ln(10) for tens of steps before it moves.
    """
    for module in model.modules():
        if isinstance(module, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            nn.init.zeros_(module.bias)
    return model
