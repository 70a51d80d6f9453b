"""What a scenario is: the thing that is trained, independent of how batches reach the device.

A scenario names a dataset factory, a model factory and a loss. Pipelines (``pipelines/``) decide how
the dataset's samples are loaded, augmented, batched and copied; the runner (``profiler/drivers/runner.py``)
drives the loop. Factories are called lazily so that listing scenarios imports no data and builds no model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Typed loosely on purpose: scenarios must not force torch types on the import of this module.
DatasetFactory = Callable[..., Any]  # () -> Dataset, or (DataOptions) -> Dataset when Scenario.data is set
ModelFactory = Callable[[], Any]
LossFn = Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class DataOptions:
    """What a file-backed scenario's dataset factory is given (``Scenario.data`` set).

    ``root`` is the data directory (``--data``, or the scenario's default set generated once into the
    cache); ``on_bad_sample`` is ``fail`` or ``skip``; ``device_type`` ("cpu" or "cuda") lets a scenario pick
    a resolution that suits where it trains.
    """

    root: Path
    on_bad_sample: str = "fail"
    device_type: str = "cpu"


@dataclass(frozen=True, slots=True)
class Scenario:
    """A trainable workload.

    ``dataset()`` returns a map-style dataset whose items are ``(input, target)`` with the scenario's
    augmentation already applied per item (so the cost lands where a real loader pays it: in
    ``__getitem__``, on the main process or a worker). ``model()`` returns an ``nn.Module``;
    ``loss(output, target)`` returns a scalar tensor.

    ``cost_forward(model, images)`` is for the simulated accelerator (``profiler.sim.cost``), which counts
    one training step's FLOPs, kernels and memory by running it on the meta device (shapes, no values). A
    model whose step needs values there (a detector's loss matches boxes to anchors by IoU) cannot run as
    is: ``cost_forward`` then runs the part that does the arithmetic on a meta batch ``[N, *input shape]``
    and returns a tensor, or a sequence or mapping of tensors; the simulator sums their elements as the
    loss and counts forward, backward and the optimizer step from that. None: the step is counted as the
    runner runs it (``model`` and ``loss``).
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
    # File-backed scenarios: the generator kind of their default data set (scenarios.datagen.KINDS) and its
    # size. When set, ``dataset`` is called with a DataOptions instead of no argument.
    data: str | None = None
    data_count: int = 0
    # Alternative models by name (``--model``); ``model`` is the default, named ``model_name``.
    models: dict[str, ModelFactory] = field(default_factory=dict)
    model_name: str = "default"
    # Detection-style models take the targets in forward (torchvision's SSD returns its losses in train
    # mode): the runner then calls ``model(x, y)`` and ``loss(output, y)`` reduces what it returned.
    targets_in_forward: bool = False
    # How the simulator counts a step whose loss cannot run on the meta device (see the class docstring).
    cost_forward: Callable[[Any, Any], Any] | None = None

    def __post_init__(self) -> None:
        # A scenario file is the user's: each field is checked here, so that a wrong type or range is one line
        # naming the field when the file loads (exit 2), not an error deep in the loader or the optimizer.
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Scenario.name must be a non-empty string, got {self.name!r}")
        for attr, lo in (("batch_size", 1), ("steps", 1), ("warmup", 0), ("data_count", 0)):
            value = getattr(self, attr)
            if not _is_int(value) or value < lo:
                raise ValueError(f"Scenario.{attr} must be an integer >= {lo}, got {value!r}")
        if not _is_number(self.lr) or not math.isfinite(self.lr) or self.lr <= 0:
            raise ValueError(f"Scenario.lr must be a finite number > 0, got {self.lr!r}")
        for attr in ("dataset", "model", "loss"):
            if not callable(getattr(self, attr)):
                raise ValueError(f"Scenario.{attr} must be callable, got {getattr(self, attr)!r}")
        for attr, kind, what in (
            ("description", str, "a string"),
            ("synthetic", bool, "True or False"),
            ("targets_in_forward", bool, "True or False"),
            ("extra", dict, "a dict"),
            ("models", dict, "a dict of name -> model factory"),
        ):
            if not isinstance(getattr(self, attr), kind):
                raise ValueError(f"Scenario.{attr} must be {what}, got {getattr(self, attr)!r}")
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"Scenario.model_name must be a non-empty string, got {self.model_name!r}")
        for key, factory in self.models.items():
            if not isinstance(key, str) or not key or not callable(factory):
                raise ValueError(f"Scenario.models must map names to callables, got {key!r}: {factory!r}")
        if self.cost_forward is not None and not callable(self.cost_forward):
            raise ValueError(f"Scenario.cost_forward must be callable or None, got {self.cost_forward!r}")
        if self.data is not None and (not isinstance(self.data, str) or not self.data):
            raise ValueError(f"Scenario.data must be a data set kind (a string) or None, got {self.data!r}")
        if self.data is not None and self.data_count < 1:
            raise ValueError(f"Scenario.data_count must be >= 1 when data is set, got {self.data_count}")

    def model_names(self) -> list[str]:
        """Every name ``--model`` accepts, the default first."""
        return [self.model_name, *sorted(set(self.models) - {self.model_name})]

    def model_factory(self, name: str | None) -> ModelFactory:
        """The factory of model ``name`` (None: the default); ValueError naming the allowed ones."""
        if name is None or name == self.model_name:
            return self.model
        if name in self.models:
            return self.models[name]
        raise ValueError(
            f"unknown model {name!r} for scenario {self.name!r}: choose one of {', '.join(self.model_names())}"
        )

    def build_dataset(self, options: DataOptions | None) -> Any:
        """The scenario's dataset; file-backed scenarios need ``options``."""
        if self.data is None:
            return self.dataset()
        if options is None:
            raise ValueError(f"scenario {self.name!r} reads files: give it DataOptions (a data directory)")
        return self.dataset(options)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def one_line(text: str) -> str:
    """``text`` with its line breaks and runs of blanks folded: how errors quote a library's message."""
    return " ".join(text.split())
