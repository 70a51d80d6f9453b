"""The suite's ``@pytest.mark.alone`` and ``@pytest.mark.light`` (tests/scheduling.py): under xdist no test runs
beside an alone test but light ones, and the light ones are kept for the time it runs.

It once did nothing: the hook's name did not start with ``pytest_``, so pytest never registered it, and a CI run's
alone tune shared the cores with other tests (others used 0.97 of a core while it ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


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
