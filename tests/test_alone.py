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


def test_only_light_tests_run_beside_an_alone_test_and_they_fill_its_time(tmp_path: Path) -> None:
    log = tmp_path / "spans.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadgroup",
         "tests/data/alone_probe.py"],
        check=False, cwd=ROOT, env={**os.environ, "ALONE_PROBE_LOG": str(log)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    spans = {name: (t0, t1) for name, t0, t1 in map(json.loads, log.read_text().splitlines())}
    assert len(spans) == 17, sorted(spans)
    a0, a1 = spans.pop("alone")
    beside = sorted(name for name, (t0, t1) in spans.items() if t0 < a1 and t1 > a0)
    # the two other workers ran light tests through the alone test's 2 s (1 s each: two or more overlap it), and
    # no normal test
    assert all(name.startswith("light") for name in beside), (beside, a0, a1, spans)
    assert len(beside) >= 2, (beside, a0, a1, spans)
