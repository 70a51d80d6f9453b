"""Pipeline registry: how batches reach the device, by name.

Entries are ``"module:attr"`` strings imported on first use, so that an optional dependency (DALI)
is imported only by the pipeline that needs it and listing the names imports nothing. Every failure
to resolve a name is a ``PipelineError`` (a ``ValueError``) with a one-line message naming the bad
value and the allowed ones: the CLI prints it as is and exits 2.

Which pipelines can train a scenario is judged from the scenario's declaration (``Scenario.data``: the
kind of file-backed data set, None for data made in memory) and what is installed, never by building the
dataset (that can mean scanning a large folder): a pipeline without an entry in ``REQUIREMENTS`` trains
every scenario. A file-backed scenario whose dataset a pipeline still cannot read (a user's own dataset
class over the files) is only found out when the loader is built, as a ``PipelineError`` there.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

from pipelines.base import BuiltLoader, LoaderSpec, Pipeline, usable_cores

# PIPELINES stays a module attribute, not in __all__: ruff RUF022 (isort order) and sorted() disagree on
# where an ALL-CAPS name goes among CamelCase ones, and __all__ must satisfy both.
__all__ = [
    "BuiltLoader",
    "LoaderSpec",
    "Pipeline",
    "PipelineError",
    "applicable",
    "check",
    "get",
    "load_attr",
    "names",
    "require",
    "usable_cores",
    "why_not",
]

PIPELINES: dict[str, str] = {
    "dali": "pipelines.dali_pipeline:DaliPipeline",
    "naive": "pipelines.naive:NaivePipeline",
    "prefetch": "pipelines.prefetch:PrefetchPipeline",
    "ray": "pipelines.ray_data:RayPipeline",
}

# name -> "module:attr" of ``(data: str | None) -> str | None``: why the pipeline cannot train a scenario whose
# ``Scenario.data`` is ``data`` on this machine (one line), None when it can
REQUIREMENTS: dict[str, str] = {
    "dali": "pipelines.dali:unusable",
    "ray": "pipelines.ray_data:unusable",
}


# pipelines a default search (tune without --pipelines) leaves out: each run starts a Ray instance (seconds), so
# they run where asked for by name; run, sweep and tune --pipelines take them as any other
BY_NAME_ONLY = frozenset({"ray"})


class PipelineError(ValueError):
    """A pipeline name that cannot be resolved; the message is one line."""


def names() -> list[str]:
    """The registered pipeline names, sorted."""
    return sorted(PIPELINES)


def why_not(name: str, data: str | None) -> str | None:
    """Why pipeline ``name`` cannot train a scenario whose ``Scenario.data`` is ``data`` here, or None when it can."""
    _target(name)
    requirement = REQUIREMENTS.get(name)
    if requirement is None:
        return None
    check: Callable[[str | None], str | None] = load_attr(requirement)
    return check(data)


def applicable(data: str | None) -> tuple[list[str], dict[str, str]]:
    """The registered pipelines (sorted) that can train a scenario whose ``Scenario.data`` is ``data`` here,
    and each one left out with why; those in ``BY_NAME_ONLY`` are in neither (asked for by name only)."""
    searched = [n for n in names() if n not in BY_NAME_ONLY]
    left_out = {n: why for n in searched if (why := why_not(n, data)) is not None}
    return [n for n in searched if n not in left_out], left_out


def require(asked: Sequence[str], data: str | None, scenario: str) -> None:
    """PipelineError (one line) naming the first of ``asked`` that cannot train scenario ``scenario`` (whose
    ``Scenario.data`` is ``data``) here, why, and the pipelines that can; an unknown name as :func:`get` says."""
    for name in asked:
        why = why_not(name, data)
        if why is not None:
            usable = applicable(data)[0]
            raise PipelineError(
                f"{name} cannot train scenario {scenario!r}: {why}; pipelines that can: {', '.join(usable)}"
            )


def check(name: str) -> None:
    """Raise PipelineError naming the allowed ones unless ``name`` is a registered pipeline (imports nothing)."""
    _target(name)


def get(name: str) -> Pipeline:
    """A fresh instance of the pipeline registered as ``name``."""
    pipeline: Pipeline = load_attr(_target(name))()
    return pipeline


def _target(name: str) -> str:
    target = PIPELINES.get(name)
    if target is None:
        raise PipelineError(f"unknown pipeline {name!r}: choose one of {', '.join(names())}")
    return target


def load_attr(target: str) -> Any:
    """The object a registry's ``"module:attr"`` entry names, its module imported now (the pipelines' and the
    scenarios' registries)."""
    module_name, _, attr = target.partition(":")
    return getattr(importlib.import_module(module_name), attr)
