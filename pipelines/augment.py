"""One augmentation, described once, realised by each pipeline with the library made for it.

``AugmentSpec`` is pipeline-neutral: it says *what* happens to a decoded image (crop, flip, affine,
normalise, float CHW), never *how*. ``naive`` and ``prefetch`` realise it with torchvision.transforms.v2 on
PIL images (``torchvision_transform``); ``dali`` realises it with DALI operators (``pipelines/dali.py``).
Comparing pipelines is only fair because they run this same description.

Invariants:
- Every realisation hands over float32 ``[C, size, size]`` normalised with ``mean``/``std`` (per channel, on
  the 0-1 scale) and C = 1 when ``grayscale`` else 3.
- ``deterministic()`` removes every random part (center crop, no flip, no affine) without changing the
  output shape or normalisation: the equivalence test compares pipelines through it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROPS = ("random-resized", "center")


@dataclass(frozen=True, slots=True)
class Affine:
    """Random affine for small grayscale images: rotate ±``degrees``, shift ±``translate`` of the side,
    zoom in ``scale``."""

    degrees: float = 10.0
    translate: float = 0.1
    scale: tuple[float, float] = (0.9, 1.1)


@dataclass(frozen=True, slots=True)
class AugmentSpec:
    """Decode -> crop -> flip -> affine -> normalise -> float CHW.

    ``crop="random-resized"``: a random area fraction in ``scale`` and aspect ratio in ``ratio`` of the
    decoded image, resized to ``size`` (Inception-style, as torchvision's and DALI's operators do).
    ``crop="center"``: resize the shorter side to ``resize`` (default ``size * 8 / 7``, i.e. 256 for 224), then
    take the central ``size`` square; ``resize=0`` crops without resizing.
    """

    size: int = 224
    crop: str = "random-resized"
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip_p: float = 0.5
    affine: Affine | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    grayscale: bool = False
    resize: int | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"AugmentSpec.size must be >= 1, got {self.size}")
        if self.crop not in CROPS:
            raise ValueError(f"AugmentSpec.crop {self.crop!r} is not one of {', '.join(CROPS)}")
        if not 0.0 <= self.flip_p <= 1.0:
            raise ValueError(f"AugmentSpec.flip_p must be in 0..1, got {self.flip_p}")
        if not (0 < self.scale[0] <= self.scale[1] <= 1.0):
            raise ValueError(f"AugmentSpec.scale must satisfy 0 < lo <= hi <= 1, got {self.scale}")
        if not (0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"AugmentSpec.ratio must satisfy 0 < lo <= hi, got {self.ratio}")
        channels = 1 if self.grayscale else 3
        if len(self.mean) != channels or len(self.std) != channels or min(self.std) <= 0:
            raise ValueError(f"AugmentSpec.mean/std need {channels} values (std > 0), got {self.mean}/{self.std}")

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    @property
    def resize_shorter(self) -> int:
        """The shorter side a center crop resizes to first (0: no resize)."""
        if self.resize is not None:
            return self.resize
        return round(self.size * 8 / 7)

    def deterministic(self) -> AugmentSpec:
        """The same spec with its random parts fixed: center crop, no flip, no affine."""
        return replace(self, crop="center", flip_p=0.0, affine=None)

    def describe(self) -> str:
        """One line for reports: what the augmentation does."""
        parts = ["decode"]
        if self.crop == "random-resized":
            parts.append(f"random-resized-crop {self.size} (scale {self.scale[0]:g}-{self.scale[1]:g})")
        elif self.resize_shorter:
            parts.append(f"resize {self.resize_shorter} + center-crop {self.size}")
        else:
            parts.append(f"center-crop {self.size}")
        if self.flip_p:
            parts.append(f"flip p={self.flip_p:g}")
        if self.affine is not None:
            a = self.affine
            parts.append(f"affine ±{a.degrees:g}° ±{a.translate:.0%} zoom {a.scale[0]:g}-{a.scale[1]:g}")
        parts.append("normalize")
        return " -> ".join(parts)


def torchvision_transform(spec: AugmentSpec) -> Any:
    """The spec as a torchvision.transforms.v2 pipeline from a PIL image to a float32 CHW tensor.

    Geometric ops run on the PIL image (PIL's SIMD resize is what most training scripts pay for);
    conversion to a tensor comes last, as in the usual ``RandomResizedCrop, RandomHorizontalFlip, ToTensor,
    Normalize`` recipe.
    """
    import torch
    from torchvision.transforms import InterpolationMode, v2

    ops: list[Any] = []
    if spec.grayscale:
        ops.append(v2.Grayscale(num_output_channels=1))
    if spec.crop == "random-resized":
        ops.append(
            v2.RandomResizedCrop(
                spec.size, scale=spec.scale, ratio=spec.ratio, interpolation=InterpolationMode.BILINEAR, antialias=True
            )
        )
    else:
        if spec.resize_shorter:
            ops.append(v2.Resize(spec.resize_shorter, interpolation=InterpolationMode.BILINEAR, antialias=True))
        ops.append(v2.CenterCrop(spec.size))
    if spec.flip_p:
        ops.append(v2.RandomHorizontalFlip(spec.flip_p))
    if spec.affine is not None:
        a = spec.affine
        ops.append(v2.RandomAffine(degrees=a.degrees, translate=(a.translate, a.translate), scale=a.scale))
    ops += [v2.PILToTensor(), v2.ToDtype(torch.float32, scale=True), v2.Normalize(list(spec.mean), list(spec.std))]
    return v2.Compose(ops)
