"""The Makefile finds its Python (issue #65 item 5): the newest of python3.13, python3.12, python3.11 and python3 that
runs and is 3.11 or later, and one line naming what it found and the version it needs when none fits.

Each case runs ``make -s python`` with a PATH that holds only the interpreters the case names (links to this machine's
pyenv versions, or a script that fails as an unselected pyenv shim does), so what the Makefile sees is exactly that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

VERSIONS = Path("/root/.pyenv/versions")
MAKE = shutil.which("make")


def _interpreter(minor: int) -> Path:
    found = sorted(VERSIONS.glob(f"3.{minor}.*/bin/python3.{minor}"))
    if not found:
        pytest.skip(f"no Python 3.{minor} under {VERSIONS} on this machine")
    return found[0]


def _make_python(tmp_path: Path, names: dict[str, Path | None]) -> subprocess.CompletedProcess[str]:
    """``make -s python`` with a PATH of only ``names`` (None: a shim that fails to run, as pyenv's does)."""
    assert MAKE is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target in names.items():
        link = bin_dir / name
        if target is None:
            link.write_text('#!/bin/sh\necho "pyenv: $(basename "$0"): command not found" >&2\nexit 127\n')
            link.chmod(0o755)
        else:
            link.symlink_to(target)
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHON", "MAKEFLAGS", "MAKELEVEL"}}
    env["PATH"] = str(bin_dir)
    return subprocess.run(
        [MAKE, "-s", "-C", str(ROOT), "python"], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_only_python3_12_on_path_is_taken(tmp_path: Path) -> None:
    done = _make_python(tmp_path, {"python3.12": _interpreter(12), "python3": _interpreter(10)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("python3.12 (3.12."), done.stdout


def test_the_newest_that_runs_is_taken_and_a_failing_shim_is_skipped(tmp_path: Path) -> None:
    names = {"python3.13": None, "python3.12": _interpreter(12), "python3.11": _interpreter(11)}
    done = _make_python(tmp_path, names)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("python3.12 (3.12."), done.stdout


def test_none_that_fits_is_one_line_naming_what_was_found_and_the_version_needed(tmp_path: Path) -> None:
    done = _make_python(tmp_path, {"python3.13": None, "python3": _interpreter(10)})
    assert done.returncode == 2
    line = done.stderr.splitlines()[0]
    assert line.startswith("make: stallscope needs Python 3.11 or later; found "), line
    assert "python3.13: not found" in line
    assert "python3.12: not found" in line
    assert "python3: 3.10." in line
    assert done.stdout == ""
