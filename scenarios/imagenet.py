"""Built-in scenario ``imagenet``: a torchvision classifier on an ImageNet-like folder of JPEGs.

From the seeds: the images/s tables for AlexNet, GoogLeNet and ResNet-50, where the loader (JPEG decode and
random-resized-crop on the CPU) decides whether the accelerator is fed. The data is SYNTHETIC: an
``imagenet-like`` ImageFolder tree (``scenarios.datagen``: ImageNet's pixel and file sizes, procedural
content), made once into the cache when ``--data`` is not given. The augmentation is one ``AugmentSpec``
(random-resized-crop, flip, normalise) that every pipeline realises with its own library, so ``naive``,
``prefetch`` and ``dali`` are compared on the same work.

Models (``--model``): resnet18 (default), resnet50, alexnet, googlenet, vgg16; all ``weights=None`` and a
1,000-class head. On CUDA the crop is ImageNet's 224 px; on a CPU it is 112 px, so that a step takes about
a second on a 2-core host instead of four, while decode cost (full-size JPEGs) stays what ImageNet pays.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pipelines.augment import AugmentSpec
from pipelines.imagefolder import ImageFolderDataset
from scenarios.base import DataOptions, Scenario
from scenarios.common import cross_entropy

NUM_CLASSES = 1000
GPU_SIZE = 224
CPU_SIZE = 112


def augment_for(device_type: str) -> AugmentSpec:
    """The training augmentation: ImageNet's recipe at a resolution that suits the device."""
    return AugmentSpec(size=GPU_SIZE if device_type == "cuda" else CPU_SIZE, crop="random-resized", flip_p=0.5)


def dataset(options: DataOptions) -> ImageFolderDataset:
    return ImageFolderDataset.from_dir(options.root, augment_for(options.device_type), options.on_bad_sample)


def _torchvision(name: str, **kwargs: Any) -> nn.Module:
    import torchvision.models as tvm

    model: nn.Module = getattr(tvm, name)(weights=None, num_classes=NUM_CLASSES, **kwargs)
    return model


def resnet18() -> nn.Module:
    return _torchvision("resnet18")


def resnet50() -> nn.Module:
    return _torchvision("resnet50")


def alexnet() -> nn.Module:
    return _torchvision("alexnet")


def googlenet() -> nn.Module:
    # no auxiliary heads: in train mode they change the output type, and the seeds' tables time the main net
    return _torchvision("googlenet", aux_logits=False, init_weights=True)


def vgg16() -> nn.Module:
    return _torchvision("vgg16")


# Sized on the project's 2-core CPU host (torch 2.14.1): see docs/pipelines.md for the measured step times.
SCENARIO = Scenario(
    name="imagenet",
    dataset=dataset,
    model=resnet18,
    loss=cross_entropy,
    batch_size=32,
    description="torchvision classifier on a synthetic ImageNet-like JPEG folder (decode + random-resized-crop)",
    steps=20,
    warmup=3,
    data="imagenet-like",
    data_count=1280,
    models={"resnet50": resnet50, "alexnet": alexnet, "googlenet": googlenet, "vgg16": vgg16},
    model_name="resnet18",
    extra={"augmentation": "random-resized-crop (scale 0.08-1), horizontal flip p=0.5, ImageNet normalisation"},
)
