"""Pipeline registry: how batches reach the device, by name.

Entries are ``"module:attr"`` strings imported on first use, so that an optional dependency (DALI)
is imported only by the pipeline that needs it and listing the names imports nothing. Every failure
to resolve a name is a ``PipelineError`` (a ``ValueError``) with a one-line message naming the bad
value and the allowed ones: the CLI prints it as is and exits 2.
"""

from __future__ import annotations

import importlib

from pipelines.base import BuiltLoader, LoaderSpec, Pipeline

# PIPELINES stays a module attribute, not in __all__: ruff RUF022 (isort order) and sorted() disagree on
# where an ALL-CAPS name goes among CamelCase ones, and __all__ must satisfy both.
__all__ = ["BuiltLoader", "LoaderSpec", "Pipeline", "PipelineError", "get", "names"]

PIPELINES: dict[str, str] = {
    "dali": "pipelines.dali_pipeline:DaliPipeline",
    "naive": "pipelines.naive:NaivePipeline",
    "prefetch": "pipelines.prefetch:PrefetchPipeline",
}


class PipelineError(ValueError):
    """A pipeline name that cannot be resolved; the message is one line."""


def names() -> list[str]:
    """The registered pipeline names, sorted."""
    return sorted(PIPELINES)


def get(name: str) -> Pipeline:
    """A fresh instance of the pipeline registered as ``name``."""
    target = PIPELINES.get(name)
    if target is None:
        raise PipelineError(f"unknown pipeline {name!r}: choose one of {', '.join(names())}")
    module_name, _, attr = target.partition(":")
    factory = getattr(importlib.import_module(module_name), attr)
    pipeline: Pipeline = factory()
    return pipeline
