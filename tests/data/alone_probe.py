"""Run by tests/test_alone.py as ``make test`` runs the suite (``-n 3 --dist loadgroup``): normal tests, one
``alone`` test and ``light`` ones, each logging its span (start, end) to ``$ALONE_PROBE_LOG``; they sleep, so a
worker blocked at the turnstile costs nothing."""

from __future__ import annotations

import json
import os
import time

import pytest


def span(name: str, seconds: float) -> None:
    t0 = time.time()
    time.sleep(seconds)
    with open(os.environ["ALONE_PROBE_LOG"], "a", encoding="utf-8") as fh:
        fh.write(json.dumps([name, t0, time.time(), os.environ.get("PYTEST_XDIST_WORKER")]) + "\n")


# first in the file: in the collection's order they would run first, not beside the alone test; shortest first
LIGHT_S = [0.5, 1.0, 1.5, 2.0]


@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.light(seconds=s)) for i, s in enumerate(LIGHT_S)])
def test_light(i: int) -> None:
    span(f"light{i}", LIGHT_S[i])


@pytest.mark.parametrize("i", range(4))
def test_before(i: int) -> None:
    span(f"before{i}", 1.0)


@pytest.mark.alone
def test_alone() -> None:
    span("alone", 2.0)


@pytest.mark.alone
def test_alone_too() -> None:
    span("alone2", 1.0)


@pytest.mark.parametrize("i", range(8))
def test_after(i: int) -> None:
    span(f"after{i}", 0.5)
