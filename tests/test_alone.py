"""The suite's ``@pytest.mark.alone`` and ``@pytest.mark.light`` (tests/scheduling.py): under xdist no test runs
beside an alone test but light ones, and the light ones are kept for the time it runs.

It once did nothing: the hook's name did not start with ``pytest_``, so pytest never registered it, and a CI run's
alone tune shared the cores with other tests (others used 0.97 of a core while it ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from conftest import ROOT
from scheduling import make_scheduler


def test_only_light_tests_run_beside_an_alone_test_and_they_fill_its_time_longest_first(tmp_path: Path) -> None:
    log = tmp_path / "spans.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         "tests/data/alone_probe.py"],
        check=False, cwd=ROOT, env={**os.environ, "ALONE_PROBE_LOG": str(log), "STALLSCOPE_TEST_CPU": ""},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    spans = {name: (t0, t1) for name, t0, t1, _ in rows}
    worker = {name: w for name, _, _, w in rows}
    assert len(spans) == 18, sorted(spans)
    for alone in ("alone", "alone2"):
        a0, a1 = spans[alone]
        beside = sorted(name for name, (t0, t1) in spans.items() if name != alone and t0 < a1 and t1 > a0)
        # only light tests ran beside it, and no normal test
        assert all(name.startswith("light") for name in beside), (alone, beside, a0, a1, spans)
    # the two other workers ran light tests through the first alone test's 2 s (1 s each: two or more overlap it)
    a0, a1 = spans["alone"]
    assert len([n for n, (t0, t1) in spans.items() if n.startswith("light") and t0 < a1 and t1 > a0]) >= 2, spans
    # the light tests were handed out longest first (their seconds), although collected shortest first: the two
    # longest (2.0 and 1.5 s) started before the two shortest
    started = sorted((n for n in spans if n.startswith("light")), key=lambda n: spans[n][0])
    assert set(started[:2]) == {"light3", "light2"}, [(n, spans[n]) for n in started]
    # the alone tests ran one after the other on one worker, no light test between them there
    first, second = sorted(("alone", "alone2"), key=lambda n: spans[n][0])
    assert worker[first] == worker[second], worker
    between = [
        n for n, (t0, _) in spans.items() if worker[n] == worker[first] and spans[first][1] <= t0 < spans[second][0]
    ]
    assert between == [], (between, spans, worker)


class FakeWorker:
    def __init__(self) -> None:
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.append(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_worker_on_the_last_alone_unit_runs_it_at_once_and_takes_nothing_behind_it() -> None:
    """An xdist worker runs a test only once it holds the next one or is told to shut down. The worker on the last
    alone unit is told to shut down: it starts that unit at once, and no light unit waits behind it (another
    worker takes it). While alone units are queued it gets the next of them, though a light one comes first."""
    config: Any = SimpleNamespace(getvalue=lambda name: ["3*popen"], option=SimpleNamespace())
    sched: Any = make_scheduler(config, SimpleNamespace(loadscopesched=lambda *args: None))
    ids = ["tests/fake.py::alone", "tests/fake.py::alone2", "tests/fake.py::light"]
    sched.alone, sched.light = frozenset(ids[:2]), frozenset(ids[2:])
    on_alone, other = FakeWorker(), FakeWorker()
    for worker in (on_alone, other):
        sched.registered_collections[worker] = ids
    sched.assigned_work = {on_alone: {ids[0]: {ids[0]: False}}, other: {}}
    sched.workqueue = OrderedDict((i, {i: False}) for i in (ids[2], ids[1]))
    sched._reschedule(on_alone)
    assert on_alone.sent == [[1]] and not on_alone.shutting_down  # the next alone unit, chained
    sched.assigned_work[on_alone][ids[0]][ids[0]] = True  # the first alone unit done, the second one held
    sched._reschedule(on_alone)
    assert on_alone.sent == [[1]] and on_alone.shutting_down and list(sched.workqueue) == [ids[2]]
    sched._reschedule(other)
    assert other.sent == [[2]] and not sched.workqueue and not other.shutting_down
