"""What a scenario is: the thing that is trained, independent of how batches reach the device.

A scenario names a dataset factory, a model factory and a loss. Pipelines (``pipelines/``) decide how
the dataset's samples are loaded, augmented, batched and copied; the runner (``profiler/runner.py``)
drives the loop. Factories are called lazily so that listing scenarios imports no data and builds no model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Typed loosely on purpose: scenarios must not force torch types on the import of this module.
DatasetFactory = Callable[[], Any]
ModelFactory = Callable[[], Any]
LossFn = Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trainable workload.

    ``dataset()`` returns a map-style dataset whose items are ``(input, target)`` with the scenario's
    augmentation already applied per item (so the cost lands where a real loader pays it: in
    ``__getitem__``, on the main process or a worker). ``model()`` returns an ``nn.Module``;
    ``loss(output, target)`` returns a scalar tensor.
    """

    name: str
    dataset: DatasetFactory
    model: ModelFactory
    loss: LossFn
    batch_size: int = 64
    description: str = ""
    steps: int = 200
    warmup: int = 10
    lr: float = 0.01
    synthetic: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("Scenario.name must be a non-empty string")
        if self.batch_size < 1:
            raise ValueError(f"Scenario.batch_size must be >= 1, got {self.batch_size}")
        for attr in ("dataset", "model", "loss"):
            if not callable(getattr(self, attr)):
                raise ValueError(f"Scenario.{attr} must be callable")
