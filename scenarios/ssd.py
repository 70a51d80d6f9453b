"""Built-in scenario ``ssd``: a torchvision SSD detector on a VOC-like set of JPEGs with SSD's augmentation.

From the seed: a Caffe SSD detector that trained *slower* at batch 16 than at batch 8 because the GPU sat at
0% between batches: SSD's per-image augmentation (expand, IoU crop, flip, resize) ran on the CPU and could
not keep up. Here the same augmentation (``pipelines.detection.DetectionAugment``: zoom-out, IoU crop, flip,
resize, normalise) runs per item in the loader, so stallscope shows where the time goes and how ``prefetch``
(overlap) and ``dali`` (DALI operators, GPU decode on CUDA) change it. The data is SYNTHETIC: a ``voc-like``
set (``scenarios.datagen``: 300-512 px JPEGs, 1-5 boxes of the 20 VOC classes, COCO manifest), made once
into the cache when ``--data`` is not given.

Models (``--model``): ssdlite320_mobilenet_v3_large (default) and ssd300_vgg16 (the seed's architecture),
both ``weights=None``, 21 classes (20 + background; the manifest's category ids 1..20 are the labels).
Both take their targets in forward (``targets_in_forward``): in train mode torchvision's SSD returns its
loss dict, which ``loss`` sums. The loader already normalises (``image_mean=0, image_std=1`` stop the model's
transform from doing it again) and already resizes: ssdlite skips its own resize (``_skip_resize``, the
switch torchvision's detection reference uses for the same purpose) and trains at the loader's size;
ssd300's anchors are laid out for 300 px, so it resizes the loader's output to 300 inside (a tensor resize;
the dataset factory sees only DataOptions, not the model, so one size serves both).

Resolution: 320 px on CUDA (ssdlite's own). On a CPU, 160 px: the loader's cost per image (decoding a
300-512 px JPEG, zoom-out and crop) hardly depends on the output size, but the model's compute falls ~4x, so
the loader's share of a step shows instead of drowning in CPU convolutions (the same choice as ``imagenet``'s
112 px on a CPU). On a GPU its share is far larger still: that is the seed.

Invariant: whatever the pipeline, a batch is ``(float32 [N, 3, S, S], [{"boxes", "labels"}] * N)``, S the size
above.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pipelines.detection import DetectionAugment, DetectionDataset
from scenarios.base import DataOptions, Scenario

NUM_CLASSES = 21  # the 20 VOC classes + background (label 0)
GPU_SIZE = 320
CPU_SIZE = 160


def augment_for(device_type: str) -> DetectionAugment:
    """The training augmentation: torchvision's SSD recipe (zoom-out up to 2x) at a size that suits the device."""
    return DetectionAugment(size=GPU_SIZE if device_type == "cuda" else CPU_SIZE)


def dataset(options: DataOptions) -> DetectionDataset:
    return DetectionDataset.from_dir(options.root, augment_for(options.device_type), options.on_bad_sample)


class DetectorLoss(nn.Module):
    """A torchvision detector in the runner's ``model(x, y)`` form: images ``[N, 3, H, W]`` -> its loss dict."""

    def __init__(self, detector: nn.Module) -> None:
        super().__init__()
        self.detector = detector

    def forward(self, images: Any, targets: list[dict[str, Any]]) -> Any:
        return self.detector(list(images), targets)


def _ssd(name: str, **kwargs: Any) -> nn.Module:
    """torchvision detector ``name``, untrained, with 21 classes, and no normalisation of its own."""
    import torchvision.models.detection as tvd

    detector = getattr(tvd, name)(
        weights=None,
        weights_backbone=None,
        num_classes=NUM_CLASSES,
        image_mean=[0.0, 0.0, 0.0],
        image_std=[1.0, 1.0, 1.0],
        **kwargs,
    )
    return DetectorLoss(detector)


def ssdlite320_mobilenet_v3_large() -> nn.Module:
    return _ssd("ssdlite320_mobilenet_v3_large", _skip_resize=True)


def ssd300_vgg16() -> nn.Module:
    # no _skip_resize: its anchors are laid out for 300 x 300, so it resizes the loader's output itself
    return _ssd("ssd300_vgg16")


def sum_losses(output: Any, target: Any) -> Any:
    """The detector's losses (``bbox_regression`` + ``classification``) as one scalar."""
    return sum(output.values())


def cost_step(model: DetectorLoss, images: Any) -> Any:
    """How the simulator counts a step of either detector (``Scenario.cost_forward``): backbone and head.

    The train-mode forward cannot run on the meta device: SSD's loss matches anchors to boxes by IoU, which
    reads values. The backbone and the head are where the FLOPs and nearly all the kernels are; their
    outputs (``cls_logits``, ``bbox_regression``) summed stand in for the loss, so the box matching,
    hard-negative mining and the loss's own elementwise work over the anchors (3,234 for ssdlite at 320 px,
    8,732 for ssd300) are left out, as are the transform's per-image normalisation and batching copies.
    The transform's resize is kept where the model does one: ssd300 resizes the loader's images to its fixed
    300 x 300 (bilinear, as ``GeneralizedRCNNTransform`` does, here once for the batch); ssdlite trains at
    the loader's size (``_skip_resize``).
    """
    import torch
    import torch.nn.functional as F

    detector: Any = model.detector
    transform = detector.transform
    if transform.fixed_size is not None and not getattr(transform, "_skip_resize", False):
        width, height = transform.fixed_size  # GeneralizedRCNNTransform's fixed_size is (width, height)
        if tuple(images.shape[-2:]) != (height, width):
            images = F.interpolate(images, size=(height, width), mode="bilinear", align_corners=False)
    features = detector.backbone(images)
    if isinstance(features, torch.Tensor):  # as SSD.forward: a single feature map is one level
        features = {"0": features}
    return detector.head(list(features.values()))


# Sized on the project's 2-core CPU host (torch 2.14.1, DALI 2.4.0, shared: load average 3-4.5 from other jobs),
# default run (batch 8, 3 warm-up + 20 steps, 160 px, --workers 0), OMP_NUM_THREADS=1, two rounds each:
#   naive     652-708 ms/step, 11.3-12.3 samples/s, data wait 141-151 ms (21-22%: "highly input-bound"), 23 s wall
#   prefetch  696-743 ms/step, 10.8-11.5 samples/s, data wait 0 (the thread loads while the step computes), 22-24 s
#   dali      631-976 ms/step,  8.2-12.7 samples/s, data wait 7 ms, 23-34 s wall
# With torch's default 2 intra-op threads on that loaded host the model's compute swung from 0.8 to 7 s per step
# (OpenMP threads descheduled at every barrier): 27-173 s wall. Loader alone (--loader-only): torchvision 26-34
# images/s, DALI (1 thread) 97-104 images/s. The default voc-like-256 set is generated in 7-9 s.
SCENARIO = Scenario(
    name="ssd",
    dataset=dataset,
    model=ssdlite320_mobilenet_v3_large,
    loss=sum_losses,
    batch_size=8,  # the seed's batch
    description="torchvision SSD on a synthetic VOC-like JPEG set with SSD's augmentation (zoom-out, IoU crop, flip)",
    steps=20,
    warmup=3,
    lr=0.002,
    data="voc-like",
    data_count=256,
    models={"ssd300_vgg16": ssd300_vgg16},
    model_name="ssdlite320_mobilenet_v3_large",
    targets_in_forward=True,
    cost_forward=cost_step,
    extra={
        "augmentation": "zoom-out 1-2x p=0.5 (mean fill), SSD IoU crop, horizontal flip p=0.5, resize to 320 "
        "(160 on a CPU), ImageNet normalisation, degenerate boxes dropped"
    },
)
