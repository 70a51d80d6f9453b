"""Object detection: one SSD augmentation spec, a COCO-format source, and the torch dataset that realises it.

The seed this serves: a Caffe SSD detector that trained *slower* at batch 16 than at batch 8 because its CPU
augmentation (expand, IoU crop, flip, resize) could not keep the GPU fed. ``DetectionAugment`` describes that
augmentation once, as torchvision's SSD reference recipe does it (``references/detection/presets.py``,
``data_augmentation="ssd"``, photometric distortion left out): zoom out onto a mean-filled canvas, a random
crop that keeps some overlap with the objects, a horizontal flip, a resize to ``size`` x ``size`` (which the
reference leaves to the model's transform) and normalisation, then boxes that became degenerate are dropped.
``naive`` and ``prefetch`` realise it with torchvision.transforms.v2 on PIL images (``DetectionDataset``);
``dali`` realises it with DALI operators (``pipelines/dali_detection.py``).

``CocoDetectionSource.scan(root)`` reads ``root/annotations.json`` (COCO: images, boxes ``[x, y, w, h]``,
category ids) and checks every file in ``root/images`` with ``pipelines.imagefolder.check_file``, under the
same bad-sample policy as ``ImageFolderSource``: with ``fail`` the first bad file is a ``BadSampleError``
naming it; with ``skip`` it is left out and listed in ``bad``. A missing directory, images directory or
manifest, or a manifest that is not COCO, is a one-line ``DataSourceError``.

Invariants:
- Every realisation hands over ``(images float32 [N, 3, size, size], targets)`` where ``targets`` is a list
  of N dicts ``{"boxes": float32 [K, 4], "labels": int64 [K]}``: boxes are ``x1, y1, x2, y2`` in pixels of
  the ``size`` x ``size`` output, inside it, at least ``min_box`` px wide and high; labels are the manifest's
  category ids (1..20 for voc-like; 0 stays free for the background class, as torchvision's SSD expects).
- An image whose objects were all cropped away keeps an empty target (``K = 0``); torchvision's SSD trains on
  it as background only. Nothing is re-drawn, so every realisation does the same amount of work per item.
- ``files``, ``file_names``, ``boxes`` and ``labels`` of a source are parallel, in image-id order (the order
  DALI's ``readers.coco`` reads in), and hold only images that passed the scan.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipelines import stages
from pipelines.augment import IMAGENET_MEAN, IMAGENET_STD
from pipelines.imagefolder import (
    BadSample,
    DataSourceError,
    check_file,
    load_rgb,
    no_usable_image,
    one_line,
    rejected,
    scan_root,
)

ANNOTATIONS = "annotations.json"
IMAGES_DIR = "images"
Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class DetectionAugment:
    """Zoom out -> IoU crop -> flip -> resize to ``size`` x ``size`` -> normalise; then drop degenerate boxes.

    ``zoom_out``: with probability ``zoom_p``, paste the image at a random place on a canvas ``r`` times its
    size, ``r`` uniform in the range (the reference's "expand"; torchvision's default range is 1-4, 1-2 here
    keeps CPU memory per item moderate), filled with ``mean`` so the border normalises to zero. None: off.
    ``iou_crop``: SSD's random crop: pick a minimum IoU from ``crop_ious`` or "no crop" (equally likely), then
    try crops of ``crop_scale`` of each side with aspect ratio in ``crop_ratio`` until one overlaps some
    object at least that much; objects whose centre falls outside the crop are dropped, the rest clipped.
    ``min_box``: boxes narrower or lower than this many output pixels are dropped (SanitizeBoundingBoxes).
    """

    size: int = 320
    iou_crop: bool = True
    zoom_out: tuple[float, float] | None = (1.0, 2.0)
    zoom_p: float = 0.5
    flip_p: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN
    std: tuple[float, float, float] = IMAGENET_STD
    crop_scale: tuple[float, float] = (0.3, 1.0)
    crop_ratio: tuple[float, float] = (0.5, 2.0)
    crop_ious: tuple[float, ...] = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9)
    crop_trials: int = 40
    min_box: float = 1.0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"DetectionAugment.size must be >= 1, got {self.size}")
        if self.zoom_out is not None and not (1.0 <= self.zoom_out[0] <= self.zoom_out[1]):
            raise ValueError(f"DetectionAugment.zoom_out must satisfy 1 <= lo <= hi, got {self.zoom_out}")
        for name in ("zoom_p", "flip_p"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"DetectionAugment.{name} must be in 0..1, got {value}")
        if not (0 < self.crop_scale[0] <= self.crop_scale[1] <= 1.0):
            raise ValueError(f"DetectionAugment.crop_scale must satisfy 0 < lo <= hi <= 1, got {self.crop_scale}")
        if not (0 < self.crop_ratio[0] <= self.crop_ratio[1]):
            raise ValueError(f"DetectionAugment.crop_ratio must satisfy 0 < lo <= hi, got {self.crop_ratio}")
        if not self.crop_ious or not all(0.0 <= v < 1.0 for v in self.crop_ious):
            raise ValueError(f"DetectionAugment.crop_ious must be values in [0, 1), got {self.crop_ious}")
        if len(self.mean) != 3 or len(self.std) != 3 or min(self.std) <= 0:
            raise ValueError(f"DetectionAugment.mean/std need 3 values (std > 0), got {self.mean}/{self.std}")

    @property
    def zooms(self) -> bool:
        return self.zoom_out is not None and self.zoom_p > 0 and self.zoom_out[1] > 1.0

    @property
    def fill(self) -> tuple[int, int, int]:
        """The zoom-out canvas colour on the 0-255 scale: the mean, so that it normalises to zero."""
        r, g, b = (round(m * 255) for m in self.mean)
        return r, g, b

    def deterministic(self) -> DetectionAugment:
        """The same spec with its random parts off: no zoom-out, no crop, no flip (resize and normalise stay)."""
        return replace(self, iou_crop=False, zoom_out=None, flip_p=0.0)

    def describe(self) -> str:
        """One line for reports: what the augmentation does."""
        parts = ["decode"]
        if self.zooms and self.zoom_out is not None:
            parts.append(f"zoom-out {self.zoom_out[0]:g}-{self.zoom_out[1]:g}x p={self.zoom_p:g}")
        if self.iou_crop:
            parts.append(f"ssd-iou-crop (scale {self.crop_scale[0]:g}-{self.crop_scale[1]:g})")
        if self.flip_p:
            parts.append(f"flip p={self.flip_p:g}")
        parts += [f"resize {self.size}x{self.size}", "normalize", "drop degenerate boxes"]
        return " -> ".join(parts)


def torchvision_detection_transform(spec: DetectionAugment) -> Any:
    """The spec as a torchvision.transforms.v2 pipeline over ``(PIL image, {"boxes", "labels"})``.

    Geometric ops run on the PIL image, as torchvision's SSD reference does; the tensor conversion comes
    after the resize, so the float work is done at ``size`` x ``size`` only.
    """
    import torch
    from torchvision.transforms import InterpolationMode, v2

    ops: list[Any] = []
    if spec.zooms and spec.zoom_out is not None:
        ops.append(v2.RandomZoomOut(fill=list(spec.fill), side_range=spec.zoom_out, p=spec.zoom_p))
    if spec.iou_crop:
        ops.append(
            v2.RandomIoUCrop(
                min_scale=spec.crop_scale[0],
                max_scale=spec.crop_scale[1],
                min_aspect_ratio=spec.crop_ratio[0],
                max_aspect_ratio=spec.crop_ratio[1],
                sampler_options=[*spec.crop_ious, 1.0],  # 1.0 is torchvision's "leave as is" option
                trials=spec.crop_trials,
            )
        )
    if spec.flip_p:
        ops.append(v2.RandomHorizontalFlip(spec.flip_p))
    ops += [
        v2.Resize((spec.size, spec.size), interpolation=InterpolationMode.BILINEAR, antialias=True),
        v2.PILToTensor(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(spec.mean), list(spec.std)),
        # RandomIoUCrop zeroes the boxes it drops: clamp, then remove those and any under ``min_box`` px
        v2.ClampBoundingBoxes(),
        v2.SanitizeBoundingBoxes(min_size=spec.min_box, min_area=spec.min_box * spec.min_box),
    ]
    return v2.Compose(ops)


@dataclass(frozen=True, slots=True)
class CocoDetectionSource:
    """Images and boxes of a COCO-format detection set: ``root/annotations.json`` + ``root/images/<file>``.

    ``boxes`` are ``x1, y1, x2, y2`` in pixels of the stored image; ``labels`` the manifest's category ids.
    ``on_bad_sample`` and ``bad`` have the meaning (and names) they have on ``ImageFolderSource``.
    """

    root: Path
    files: tuple[str, ...]  # ``image_root / file_name``: what is decoded and named in messages
    file_names: tuple[str, ...]  # as the manifest spells them (relative to ``image_root``): DALI's ``images``
    boxes: tuple[tuple[Box, ...], ...]
    labels: tuple[tuple[int, ...], ...]
    categories: tuple[int, ...]
    on_bad_sample: str = "fail"
    bad: tuple[BadSample, ...] = ()

    @property
    def image_root(self) -> Path:
        return self.root / IMAGES_DIR

    @property
    def annotations(self) -> Path:
        return self.root / ANNOTATIONS

    @classmethod
    def scan(cls, root: Path | str, on_bad_sample: str = "fail") -> CocoDetectionSource:
        root = scan_root(root, on_bad_sample)
        manifest = root / ANNOTATIONS
        image_root = root / IMAGES_DIR
        if not manifest.is_file() or not image_root.is_dir():
            missing = ANNOTATIONS if not manifest.is_file() else f"{IMAGES_DIR}/"
            raise DataSourceError(
                f"data directory {str(root)!r} has no {missing}: expected ROOT/{ANNOTATIONS} (COCO) and "
                f"ROOT/{IMAGES_DIR}/<image> (make one with `stallscope data make voc-like --out DIR --count N`)"
            )
        images, by_image, categories = _read_manifest(manifest)
        files: list[str] = []
        names: list[str] = []
        boxes: list[tuple[Box, ...]] = []
        labels: list[tuple[int, ...]] = []
        bad: list[BadSample] = []
        for image_id, name in images:
            path = image_root / name
            reason = check_file(path)
            if reason is not None:
                bad.append(rejected(path, reason, on_bad_sample))
                continue
            objects = by_image.get(image_id, [])
            files.append(str(path))
            names.append(name)
            boxes.append(tuple(box for box, _ in objects))
            labels.append(tuple(label for _, label in objects))
        if not files:
            raise no_usable_image(root, len(bad))
        return cls(root, tuple(files), tuple(names), tuple(boxes), tuple(labels), categories, on_bad_sample, tuple(bad))


def _read_manifest(path: Path) -> tuple[list[tuple[int, str]], dict[int, list[tuple[Box, int]]], tuple[int, ...]]:
    """``(image id, file name)`` in id order, each image's ``(xyxy box, category id)``, and the category ids."""
    try:
        data = json.loads(path.read_text())
        images = sorted((int(im["id"]), str(im["file_name"])) for im in data["images"])
        by_image: dict[int, list[tuple[Box, int]]] = {}
        for ann in data.get("annotations", []):
            x, y, w, h = (float(v) for v in ann["bbox"])
            # COCO allows zero-size boxes; no realisation could keep them (DALI's reader drops them too)
            if w > 0 and h > 0:
                by_image.setdefault(int(ann["image_id"]), []).append(((x, y, x + w, y + h), int(ann["category_id"])))
        categories = tuple(sorted(int(c["id"]) for c in data.get("categories", [])))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        detail = one_line(exc)
        raise DataSourceError(
            f"annotations file {str(path)!r} is not a readable COCO manifest "
            f"(needs images[id, file_name] and annotations[image_id, bbox, category_id]): {detail}"
        ) from None
    return images, by_image, categories


def collate_detection(items: list[Any]) -> tuple[Any, list[dict[str, Any]]]:
    """``(images [N, 3, S, S], [{"boxes", "labels"}] * N)`` from dataset items; ``BadSample`` items are left out.

    When every item was skipped the images tensor has N = 0 (``SkipCollate`` drops such batches before they
    reach this function once the pipeline wraps it).
    """
    import torch

    good = [it for it in items if not isinstance(it, BadSample)]
    if not good:
        return torch.empty(0), []
    return torch.stack([image for image, _ in good]), [target for _, target in good]


class DetectionDataset:
    """Map-style dataset over a ``CocoDetectionSource``: PIL decode + the spec's torchvision realisation.

    Items are ``(float32 [3, size, size], {"boxes": float32 [K, 4], "labels": int64 [K]})``, or a ``BadSample``
    under the skip policy when a file that passed the scan fails to decode. Batch with ``collate_fn``.
    """

    def __init__(self, source: CocoDetectionSource, augment: DetectionAugment) -> None:
        self.source = source
        self.augment = augment
        self.transform = torchvision_detection_transform(augment)

    @classmethod
    def from_dir(cls, root: Path | str, augment: DetectionAugment, on_bad_sample: str = "fail") -> DetectionDataset:
        return cls(CocoDetectionSource.scan(root, on_bad_sample), augment)

    def __len__(self) -> int:
        return len(self.source.files)

    def __getitem__(self, index: int) -> Any:
        import torch
        from torchvision import tv_tensors

        rgb = load_rgb(self.source.files[index], self.source.on_bad_sample)
        if isinstance(rgb, BadSample):
            return rgb
        boxes = tv_tensors.BoundingBoxes(
            torch.tensor(self.source.boxes[index], dtype=torch.float32).reshape(-1, 4),
            format=tv_tensors.BoundingBoxFormat.XYXY,
            canvas_size=(rgb.height, rgb.width),
        )
        labels = torch.tensor(self.source.labels[index], dtype=torch.int64)
        with stages.timed("augment"):
            image, target = self.transform(rgb, {"boxes": boxes, "labels": labels})
        # plain tensors from here on: the model and the collate need no tv_tensors metadata
        return image, {"boxes": target["boxes"].as_subclass(torch.Tensor), "labels": target["labels"]}

    # a module-level function, not a bound method: it pickles to DataLoader workers without the dataset
    collate_fn = staticmethod(collate_detection)
