"""Scenario registry: built-in scenarios by name, user scenarios by path to a Python file.

A user file is a plain Python module that defines a module-level ``scenario = Scenario(...)``.
Built-ins are recorded as ``"module:attr"`` strings and imported only when asked for, so listing the
names imports neither torch nor any dataset. Every failure to resolve a scenario is a ``ScenarioError``
(a ``ValueError``) whose message is one line naming the bad value and what is allowed: the CLI prints it
as is and exits 2.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from pipelines import load_attr
from scenarios.base import DataOptions, Scenario, one_line

__all__ = ["BUILTIN", "DataOptions", "Scenario", "ScenarioError", "get", "names"]

BUILTIN: dict[str, str] = {
    "bilstm-imdb": "scenarios.imdb:BILSTM_IMDB",
    "cifar-vgg": "scenarios.cifar:SCENARIO",
    "cnn-mnist": "scenarios.mnist:CNN_MNIST",
    "fashion-vgg": "scenarios.fashion_vgg:SCENARIO",
    "fasttext-imdb": "scenarios.imdb:FASTTEXT_IMDB",
    "imagenet": "scenarios.imagenet:SCENARIO",
    "mlp-mnist": "scenarios.mnist:MLP_MNIST",
    "ssd": "scenarios.ssd:SCENARIO",
}

_USER_HINT = "a path to a .py file defining `scenario = Scenario(...)`"


class ScenarioError(ValueError):
    """A scenario name or file that cannot be resolved; the message is one line."""


def names() -> list[str]:
    """The built-in scenario names, sorted."""
    return sorted(BUILTIN)


def get(name_or_path: str) -> Scenario:
    """Resolve a built-in name or a ``.py`` file path to a ``Scenario``."""
    if name_or_path in BUILTIN:
        return _load_builtin(name_or_path)
    if name_or_path.endswith(".py"):
        return _load_file(Path(name_or_path), shown=name_or_path)
    raise ScenarioError(f"unknown scenario {name_or_path!r}: choose one of {', '.join(names())}, or {_USER_HINT}")


def _load_builtin(name: str) -> Scenario:
    scenario = load_attr(BUILTIN[name])
    if not isinstance(scenario, Scenario):
        # A broken registry entry is a bug in this package, not bad input: do not dress it up.
        raise TypeError(f"built-in scenario {name!r} ({BUILTIN[name]}) is not a Scenario")
    return scenario


def _load_file(path: Path, *, shown: str) -> Scenario:
    if not path.exists():
        raise ScenarioError(f"scenario file {shown!r} does not exist")
    if not path.is_file():
        raise ScenarioError(f"scenario file {shown!r} is not a file")
    resolved = path.resolve()
    # A stable, unique module name per file: the module must be in sys.modules while it executes
    # (dataclasses and pickling to DataLoader workers look classes up there), and two user files
    # with the same stem must not replace each other.
    digest = hashlib.sha1(os.fsencode(resolved)).hexdigest()[:12]  # any path, UTF-8 or not
    module_name = f"stallscope_user_scenario_{resolved.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise ScenarioError(f"scenario file {shown!r} cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # SystemExit/KeyboardInterrupt in user code included: clean up first
        sys.modules.pop(module_name, None)
        if not isinstance(exc, Exception):
            raise
        detail = one_line(str(exc))
        raise ScenarioError(
            f"scenario file {shown!r} failed to load: {type(exc).__name__}" + (f": {detail}" if detail else "")
        ) from exc
    scenario = getattr(module, "scenario", None)
    if scenario is None:
        sys.modules.pop(module_name, None)
        raise ScenarioError(f"scenario file {shown!r} defines no `scenario`: add `scenario = Scenario(...)`")
    if not isinstance(scenario, Scenario):
        sys.modules.pop(module_name, None)
        raise ScenarioError(
            f"scenario file {shown!r} defines `scenario` as {type(scenario).__name__}, "
            "not a Scenario (from scenarios import Scenario)"
        )
    return scenario
