"""The ``dali`` pipeline's detection path: ``DetectionAugment`` realised with DALI operators.

``DaliPipeline.build`` (``pipelines/dali_pipeline.py``) hands a ``DetectionDataset`` to ``build_detection``. The graph
reads the same ``CocoDetectionSource`` the torch path reads and does the same work in the same order:

  readers.coco (``images=`` the scanned file list; boxes ltrb, relative; category ids as the manifest has them)
  -> decoders.image ("mixed" on CUDA: nvJPEG on the GPU; "cpu" otherwise)
  -> zoom-out: paste onto a mean-filled canvas + bbox_paste, behind a coin flip (p = zoom_p)
  -> IoU crop: random_bbox_crop (same thresholds, scale range, pixel aspect ratio, trials) + slice
  -> resize to size x size -> crop_mirror_normalize, whose ``mirror`` shares one coin flip with bb_flip
  -> boxes and labels padded with -1 to the batch's largest count (a batch of ragged boxes is not a tensor)

``DetectionBatches`` turns the padded ``[N, K, 4]`` / ``[N, K]`` back into one target dict per image, in
pixels of the output, dropping padding rows and boxes under ``min_box`` px (SanitizeBoundingBoxes' rule).

What differs from the torchvision realisation (``DetectionDataset``), by design or by library:
- The random draws: DALI's samplers, same distributions, not the same numbers.
- The zoom-out canvas is ``round(side * ratio)``, torchvision's ``int(side * ratio)``: a pixel at most.
- IoU crop: DALI's crop window is continuous (relative coordinates) where torchvision's is whole pixels, and
  when no window is found in ``crop_trials`` attempts for a threshold DALI draws another threshold, as
  torchvision does (which may then be "no crop").
- Flip runs after the resize (fused into crop_mirror_normalize); torchvision flips before. A mirror commutes
  with a resize to a fixed size, so the output distribution is the same.
- Resampling: DALI filters in float and rounds once, PIL in 8-bit fixed point: a few grey levels apart.

Invariants:
- A batch is exactly what the torch path hands over: ``(images float32 [N, 3, S, S], [{"boxes": float32
  [K, 4], "labels": int64 [K]}] * N)``. Images are on the pipeline's device (the GPU with mixed decode);
  the targets come out of DALI's CPU operators and ``to_device`` moves them (a few hundred bytes) in ``h2d``.
- Files the scan left out are never read: the reader gets the scanned list (``images=``), not the manifest's.
  A file that passes the scan but fails to decode fails the run whatever the policy (a DALI batch cannot
  drop one sample); the error names the file when PIL can find it, as ``pipelines/dali.py`` does.
- Every pass starts at an epoch boundary: an epoch abandoned part-way is drained at the next ``iter()``.
- DALI is imported only inside functions (``pipelines.dali.import_dali``); without it, building is the same
  one-line ``PipelineError`` as for image folders.
"""

from __future__ import annotations

from typing import Any

import torch

from pipelines.base import BuiltLoader, LoaderSpec
from pipelines.dali import DaliEpochs, build_loader, new_pipe, reader_options
from pipelines.detection import CocoDetectionSource, DetectionAugment, DetectionDataset

OUTPUTS = ("images", "boxes", "labels")
_PAD = -1  # labels are category ids (>= 0): -1 marks a padding row

Targets = list[dict[str, torch.Tensor]]


def _augment(dali: Any, images: Any, boxes: Any, labels: Any, *, shape: Any, aug: DetectionAugment) -> tuple[Any, ...]:
    """The spec as DALI operators over decoded images and relative ltrb boxes; ``shape`` is the HWC shape."""
    fn, types = dali.fn, dali.types
    width = fn.cast(shape[1], dtype=types.FLOAT)
    height = fn.cast(shape[0], dtype=types.FLOAT)
    if aug.zooms and aug.zoom_out is not None:
        zoom = fn.cast(fn.random.coin_flip(probability=aug.zoom_p), dtype=types.FLOAT)
        ratio = 1.0 + zoom * (fn.random.uniform(range=list(aug.zoom_out)) - 1.0)
        paste_x = fn.random.uniform(range=[0.0, 1.0])
        paste_y = fn.random.uniform(range=[0.0, 1.0])
        images = fn.paste(images, ratio=ratio, paste_x=paste_x, paste_y=paste_y, fill_value=list(aug.fill))
        boxes = fn.bbox_paste(boxes, ratio=ratio, paste_x=paste_x, paste_y=paste_y, ltrb=True)
        width, height = width * ratio, height * ratio
    if aug.iou_crop:
        anchor, crop, boxes, labels = fn.random_bbox_crop(
            boxes,
            labels,
            bbox_layout="xyXY",
            # with the pixel shape, aspect_ratio is a pixel ratio as torchvision's is; without it, a relative one
            input_shape=fn.cast(fn.stack(width, height), dtype=types.INT32),
            shape_layout="WH",
            aspect_ratio=list(aug.crop_ratio),
            scaling=list(aug.crop_scale),
            thresholds=list(aug.crop_ious),
            allow_no_crop=True,  # torchvision's "leave as is" option, drawn as often as each threshold
            all_boxes_above_threshold=False,  # torchvision: one object overlapping enough is enough
            num_attempts=aug.crop_trials,
        )
        images = fn.slice(
            images,
            anchor,
            crop,
            axis_names="WH",
            normalized_anchor=True,
            normalized_shape=True,
            out_of_bounds_policy="trim_to_shape",
        )
    images = fn.resize(images, resize_x=aug.size, resize_y=aug.size, interp_type=types.INTERP_LINEAR, antialias=True)
    cmn: dict[str, Any] = {}
    if aug.flip_p:
        flip = fn.random.coin_flip(probability=aug.flip_p)
        boxes = fn.bb_flip(boxes, ltrb=True, horizontal=flip)
        cmn["mirror"] = flip  # flipped in the normalisation pass: one pass over the pixels instead of two
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[m * 255 for m in aug.mean],
        std=[s * 255 for s in aug.std],
        **cmn,
    )
    return images, boxes, labels


def _build_pipe(
    dali: Any, source: CocoDetectionSource, aug: DetectionAugment, spec: LoaderSpec, cuda: int | None
) -> Any:
    fn, types = dali.fn, dali.types
    pipe = new_pipe(dali, spec, cuda)
    with pipe:
        encoded, boxes, labels = fn.readers.coco(
            file_root=str(source.image_root),
            annotations_file=str(source.annotations),
            images=list(source.file_names),
            ltrb=True,
            ratio=True,  # relative boxes: what bbox_paste, random_bbox_crop and bb_flip work in
            avoid_class_remapping=True,  # category ids as the manifest has them, as the torch path keeps them
            skip_empty=False,
            # a full permutation per epoch and epochs that start at their first sample, as pipelines/dali.py reads
            **reader_options(spec),
        )
        shape = fn.peek_image_shape(encoded)  # from the header, on the CPU: the decoded image may be on the GPU
        images = fn.decoders.image(
            encoded, device="cpu" if cuda is None else "mixed", output_type=types.RGB, adjust_orientation=False
        )
        images, boxes, labels = _augment(dali, images, boxes, labels, shape=shape, aug=aug)
        boxes = fn.pad(boxes, fill_value=_PAD, axes=(0,))
        labels = fn.pad(fn.reshape(labels, shape=[-1]), fill_value=_PAD, axes=(0,))
        pipe.set_outputs(images, boxes, labels)
    return pipe


def unpad_targets(boxes: torch.Tensor, labels: torch.Tensor, size: int, min_box: float) -> Targets:
    """Per-image ``{"boxes", "labels"}`` from padded relative ``[N, K, 4]`` ltrb boxes and ``[N, K]`` labels.

    Boxes are scaled to pixels of the ``size`` x ``size`` output and clamped to it; rows labelled -1 (padding)
    and boxes narrower or lower than ``min_box`` px are dropped (SanitizeBoundingBoxes' rule).
    """
    targets: Targets = []
    for rel, lab in zip(boxes.reshape(boxes.shape[0], -1, 4), labels.reshape(labels.shape[0], -1), strict=True):
        px = (rel.float() * size).clamp_(0, size)
        wh = px[:, 2:] - px[:, :2]
        keep = (lab != _PAD) & (wh >= min_box).all(dim=1) & (wh.prod(dim=1) >= min_box * min_box)
        targets.append({"boxes": px[keep].contiguous(), "labels": lab[keep].to(torch.int64)})
    return targets


class DetectionBatches(DaliEpochs):
    """Detection: ``(images, targets)`` batches, one target dict per image (see ``unpad_targets``)."""

    def __init__(self, pipe: Any, iterator: Any, source: CocoDetectionSource, aug: DetectionAugment, n: int) -> None:
        super().__init__(pipe, iterator, source, n)
        self._size = aug.size
        self._min_box = aug.min_box

    def _convert(self, out: dict[str, Any]) -> tuple[torch.Tensor, Targets]:
        return out["images"], unpad_targets(out["boxes"], out["labels"], self._size, self._min_box)

    def _named(self, message: str) -> str | None:
        # readers.coco may name the file relative to file_root: a COCO set has one flat image folder
        files = self._source.files
        return next((p for p in files if p in message or f"/{p.rsplit('/', 1)[-1]}" in message), None)


def build_detection(dataset: DetectionDataset, spec: LoaderSpec) -> BuiltLoader:
    """The ``dali`` pipeline over a ``DetectionDataset``: its source and augment, realised by DALI."""
    source, aug = dataset.source, dataset.augment
    return build_loader(
        dataset,
        spec,
        source,
        graph=lambda dali, cuda: _build_pipe(dali, source, aug, spec, cuda),
        outputs=OUTPUTS,
        batches=lambda pipe, iterator, per_epoch: DetectionBatches(pipe, iterator, source, aug, per_epoch),
        config={"task": "detection"},
    )
