"""Pieces the built-in scenarios share: their loss and Keras's default initialisation."""

from __future__ import annotations

from typing import Any

from torch import nn
from torch.nn import functional as F


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
