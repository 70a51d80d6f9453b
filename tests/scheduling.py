"""How the suite's tests are handed to xdist's workers (``make test``: three at a time, ``--dist loadgroup``).

- **Work units.** A documented command may read what the commands above it in its doc made, so a doc's commands
  are one unit, run in order on one worker; so are the tests of a file that share a module- or session-scoped
  fixture (a fixture runs once per worker that runs one of its tests), and the files that name one group
  (``pytestmark = pytest.mark.xdist_group("NAME")``). Every other test is a unit of its own.
- **alone** (``@pytest.mark.alone``): a test whose truth is which configuration is best on this host's cores runs
  with no other test beside it, except light ones. Each test passes a turnstile and holds the cores' lock shared;
  an alone test holds the turnstile (no test starts) and takes the lock exclusively (the running ones end first).
- **light** (``@pytest.mark.light``): a test that mostly waits (on sleeps, a throttled read, a slow server) and
  uses under a quarter of a core over its run, measured (docs/testing.md). It takes neither the turnstile nor the
  lock, so it may run beside an alone test, and the scheduler keeps the light units for the time the alone tests
  run: the other two workers then have work that leaves the cores to the alone test, instead of sitting idle.
  ``seconds=S`` gives its measured wall clock: the light units are handed out longest first, so that the short
  ones fill the end (the worker that ran the alone units takes what is left) rather than a long one starting last.

The scheduler runs in pytest's controller, which collects nothing and so sees no marker: each worker writes which
units are alone and which light to the run's folder as it collects, and the scheduler reads it there.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import functools
import json
import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_COMMAND = re.compile(r"test_docs_examples\.py::test_documented_command\[(.+):\d+\]$")
SHARED_FIXTURE = re.compile(r"@pytest\.fixture\(scope=\"(module|session)\"")
# a file's ``pytestmark = pytest.mark.xdist_group("NAME")``: its tests join every other such file's of that NAME in one
# unit (the Ray files: three local Ray instances starting at once on the 2 cores slowed each other; xdist's own mark
# does nothing under pytest 9, below)
GROUP = re.compile(r"^pytestmark = pytest\.mark\.xdist_group\(\"([\w-]+)\"\)", re.MULTILINE)
KINDS = "units.json"
UNIT_SECONDS = ROOT / "tests" / "data" / "unit_seconds.json"


@functools.cache
def shares_a_fixture(path: str) -> bool:
    """Whether the test file at ``path`` (relative to the checkout) defines a module- or session-scoped fixture."""
    file = ROOT / path
    return file.is_file() and SHARED_FIXTURE.search(file.read_text(encoding="utf-8")) is not None


def work_unit(nodeid: str) -> str:
    """The xdist work unit of a test: its doc for a documented command, its file where the file's tests share a
    fixture, else the test itself."""
    m = DOC_COMMAND.search(nodeid)
    if m:
        return m.group(1)
    path = nodeid.split("::", 1)[0]
    if (group := file_group(path)) is not None:
        return f"group:{group}"
    return path if shares_a_fixture(path) else nodeid


@functools.cache
def file_group(path: str) -> str | None:
    """The group NAME a test file at ``path`` puts all its tests in (``GROUP``); None for most files."""
    file = ROOT / path
    m = GROUP.search(file.read_text(encoding="utf-8")) if file.is_file() else None
    return m.group(1) if m else None


def unit_kinds(items: list[pytest.Item]) -> dict[str, list[str]]:
    """{"alone": units holding an alone test, "light": units whose every test is light}."""
    alone = {work_unit(i.nodeid) for i in items if i.get_closest_marker("alone") is not None}
    heavy = {work_unit(i.nodeid) for i in items if i.get_closest_marker("light") is None}
    light = {work_unit(i.nodeid) for i in items} - heavy - alone
    return {"alone": sorted(alone), "light": sorted(light)}


def light_seconds(item: pytest.Item) -> float:
    """A light test's measured seconds (``@pytest.mark.light(seconds=S)``); 0 for any other test."""
    marker = item.get_closest_marker("light")
    return float(marker.kwargs.get("seconds", 0.0)) if marker is not None else 0.0


@functools.cache
def recorded_seconds() -> dict[str, float]:
    """The units' seconds as a CI run measured them (UNIT_SECONDS, written by benchmarks/unit_seconds.py): only the
    slow ones are there, and a unit not there is taken as short. Without the file, none (the order by test count);
    tests/test_unit_order.py fails then."""
    if not UNIT_SECONDS.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(UNIT_SECONDS.read_text(encoding="utf-8"))["seconds"].items()}


def run_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The collection's order: the units a CI run measured longest first (UNIT_SECONDS), then the others with the
    most tests first, each unit's tests in collection order, then the light units, longest first, and the alone
    units last. (The scheduler below picks the alone and light units by their kind, whatever their place, in this
    order; it is also what a plain ``-n`` follows.) Longest first because the alone units wait for every other
    running test to end: by test count, the 65-151 s single tests came last among the others, so the alone test
    could wait for one started last while the other workers had only light tests (docs/testing.md)."""
    size = collections.Counter(work_unit(item.nodeid) for item in items)
    recorded = recorded_seconds()
    seconds: collections.Counter[str] = collections.Counter()
    for item in items:
        seconds[work_unit(item.nodeid)] += light_seconds(item)
    kinds = unit_kinds(items)
    alone, light = set(kinds["alone"]), set(kinds["light"])

    def key(item: pytest.Item) -> tuple[bool, bool, float, float, int]:
        unit = work_unit(item.nodeid)
        return unit in alone, unit in light, -seconds[unit], -recorded.get(unit, 0.0), -size[unit]

    return sorted(items, key=key)


def run_folder(config: pytest.Config) -> Path | None:
    """This xdist run's folder for its locks and unit kinds (shared by the controller and its workers); None
    outside xdist, where one process runs one test at a time anyway."""
    run = getattr(config, "workerinput", {}).get("testrunuid") or config.getoption("testrunuid", None)
    if run is None:
        return None
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"stallscope-tests-{run}"
    d.mkdir(exist_ok=True)
    return d


def name_the_run(config: pytest.Config) -> None:
    """In the controller of an xdist run: a run id chosen here, so that the scheduler knows the workers' folder
    (xdist passes it to each worker as their ``testrunuid``)."""
    controller = not hasattr(config, "workerinput") and config.getoption("numprocesses", None)
    if controller and config.getoption("testrunuid", None) is None:
        config.option.testrunuid = uuid.uuid4().hex


def write_kinds(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a worker, after collection: the unit kinds, for the controller's scheduler (every worker writes the same)."""
    d = run_folder(config)
    if d is None or not hasattr(config, "workerinput"):
        return
    tmp = d / f"{KINDS}.{os.getpid()}"
    tmp.write_text(json.dumps(unit_kinds(items)), encoding="utf-8")
    tmp.replace(d / KINDS)


def make_scheduler(config: pytest.Config, log: object) -> object:
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # the collection is in run_order already

    class ByKind(LoadScopeScheduling):
        """Units in the collection's order, except: once only alone and light units are left, the alone units go to
        one worker, one after another, and the light units to the others."""

        alone: frozenset[str] = frozenset()
        light: frozenset[str] = frozenset()

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def schedule(self) -> None:
            d = run_folder(self.config)
            if self.collection is None and d is not None and (d / KINDS).exists():
                kinds = json.loads((d / KINDS).read_text(encoding="utf-8"))
                self.alone, self.light = frozenset(kinds["alone"]), frozenset(kinds["light"])
            super().schedule()

        def _running_alone(self) -> set[object]:
            """The workers holding an alone unit not yet complete."""
            return {
                node
                for node, units in self.assigned_work.items()
                if any(scope in self.alone and not all(tests.values()) for scope, tests in units.items())
            }

        def _next_scope(self, node: object) -> str:
            queued = list(self.workqueue)
            normal = [s for s in queued if s not in self.alone and s not in self.light]
            alone = [s for s in queued if s in self.alone]
            light = [s for s in queued if s in self.light]
            if normal:
                return normal[0]
            # the alone units one after another on one worker (the next is its look-ahead, so it starts as soon as
            # the last ends), the light units on the others
            # and not while another worker holds a normal unit behind the one it runs (xdist's look-ahead): that one
            # would wait at the turnstile through the whole alone unit, its worker lost to the light units (the probe
            # beside two busy processes, 2 runs in 10: one light test beside the alone one)
            running = self._running_alone()
            if alone and (not running or node in running) and not (light and not running and self._normal_held()):
                return alone[0]
            return (light or alone)[0]

        def _normal_held(self) -> bool:
            """Whether a worker holds a normal unit not yet started: one behind the unit it runs."""
            for units in self.assigned_work.values():
                waiting = [scope for scope, tests in units.items() if not all(tests.values())][1:]
                if any(scope not in self.alone and scope not in self.light for scope in waiting):
                    return True
            return False

        def _reschedule(self, node: Any) -> None:
            # an xdist worker runs a test only once it holds the next one, or is told to shut down. Behind the last
            # alone unit a light one would wait for it (a fresh-clone run: an 11 s light test started after the 72 s
            # tune, the other workers done 27 s before); given none, the worker held the tune back until the queue
            # ran dry (58 s, the next run). So that worker is told to shut down: it runs the alone unit at once and
            # takes nothing more, and the other workers run the light units meanwhile.
            others = [n for n in self.nodes if n is not node and not n.shutting_down]
            last = self.workqueue and not any(scope in self.alone for scope in self.workqueue)
            if last and others and node in self._running_alone() and not node.shutting_down:
                node.shutdown()
                return
            super()._reschedule(node)

        def _assign_work_unit(self, node: object) -> None:
            self.workqueue.move_to_end(self._next_scope(node), last=False)
            super()._assign_work_unit(node)  # type: ignore[arg-type]

    return ByKind(config, log)  # type: ignore[arg-type]


@contextlib.contextmanager
def cores(item: pytest.Item) -> Iterator[None]:
    """The turnstile and the cores' lock around one test (see the module's docstring)."""
    d = run_folder(item.config)
    if d is None or not hasattr(item.config, "workerinput") or item.get_closest_marker("light") is not None:
        yield
        return
    alone = item.get_closest_marker("alone") is not None
    with open(d / "turnstile", "a") as gate, open(d / "cores", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
