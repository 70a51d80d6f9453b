"""The kernels of each calibration point (:data:`profiler.sim.calibration.POINTS`), counted on the meta device: the
``work_of`` that :func:`profiler.sim.calibration.calibrate` takes. Each point's model is the one it was measured
with: torchvision's ResNets on 224-px images with cross-entropy, or the fashion-vgg scenario's model and data."""

from __future__ import annotations

from profiler.sim.calibration import Point
from profiler.sim.roofline import Work


def point_work(point: Point) -> Work:
    """Each kernel's (FLOPs, bytes) of one training step of ``point``'s model at its batch size and precision."""
    import torch

    import scenarios
    from profiler.sim.cost import measure_step

    if point.model in ("resnet50", "resnet18"):  # the imagenet scenario's model, on a 224-px image (its CUDA crop)
        sc, sample = scenarios.get("imagenet"), (torch.zeros(3, 224, 224), 0)
        factory = sc.model_factory(point.model)
    else:
        sc = scenarios.get(point.model)
        factory, sample = sc.model_factory(None), sc.build_dataset(None)[0]
    cost = measure_step(
        factory, sample, point.batch_size, precision=point.precision, loss=sc.loss, cost_forward=sc.cost_forward,
        targets_in_forward=sc.targets_in_forward,
    )  # fmt: skip
    return cost.work
