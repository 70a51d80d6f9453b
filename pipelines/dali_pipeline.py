"""The ``dali`` pipeline's entry in the registry: a detection dataset goes to ``pipelines.dali_detection``, an
image folder to ``pipelines.dali``. Both import the shared DALI plumbing from ``pipelines.dali``; this module
sits above them so that neither imports the other. DALI itself is imported only when a loader is built."""

from __future__ import annotations

from typing import Any

from pipelines.base import BuiltLoader, LoaderSpec
from pipelines.dali import build_classification
from pipelines.dali_detection import build_detection
from pipelines.detection import DetectionDataset


class DaliPipeline:
    """DALI reader + decoder + augmentation in native threads; mixed (GPU) decoding on CUDA."""

    name = "dali"
    # how batches reach an accelerator, for the simulated device: DALI CPU path, decoded images from pageable memory
    accelerator_copy = "pageable"

    def build(self, dataset: Any, spec: LoaderSpec) -> BuiltLoader:
        if isinstance(dataset, DetectionDataset):
            return build_detection(dataset, spec)
        return build_classification(dataset, spec)
