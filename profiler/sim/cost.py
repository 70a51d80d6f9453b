"""What one training step costs the device: FLOPs, kernels and memory, counted once on the meta device.

The model is built under ``torch.device("meta")`` (no weights in host memory, no arithmetic) and one step
(forward, loss, backward, optimizer) is traced with ``torch.utils.flop_counter.FlopCounterMode``. A scenario
whose loss cannot run on the meta device (data-dependent box matching) gives ``Scenario.cost_forward``.

API (implemented by the cost-model work; the simulator relies on exactly this):
    measure_step(model_factory, sample, batch_size, *, precision, loss=None, cost_forward=None,
                 targets_in_forward=False) -> StepCost
    raises CostModelError (one line: why the model cannot be traced) when the step fails on meta.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class CostModelError(ValueError):
    """The model's step could not be traced on the meta device; the message is one line and says why."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """One training step at ``batch_size``, as counted on the meta device (estimates, never measured)."""

    batch_size: int
    flops: float  # forward + backward + optimizer, as FlopCounterMode counts them (2 per multiply-add)
    kernels: int  # device kernels one step launches (aten ops that compute, views excluded)
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int  # tensors saved for backward at the step's peak
    precision: str

    @property
    def memory_bytes(self) -> int:
        """Device memory the step needs (weights, gradients, optimizer state, saved activations)."""
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes + self.activation_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_size": self.batch_size,
            "flops": self.flops,
            "kernels": self.kernels,
            "param_bytes": self.param_bytes,
            "grad_bytes": self.grad_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "activation_bytes": self.activation_bytes,
            "memory_bytes": self.memory_bytes,
            "precision": self.precision,
        }
