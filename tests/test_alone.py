"""The suite's ``@pytest.mark.alone`` (tests/conftest.py): under xdist no other test runs beside such a test.

It once did nothing: the hook's name did not start with ``pytest_``, so pytest never registered it, and a CI run's
alone tune shared the cores with other tests (others used 0.97 of a core while it ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT


def test_no_other_test_runs_beside_an_alone_test(tmp_path: Path) -> None:
    log = tmp_path / "spans.jsonl"
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "tests/data/alone_probe.py"],
        check=False, cwd=ROOT, env={**os.environ, "ALONE_PROBE_LOG": str(log)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    spans = {name: (t0, t1) for name, t0, t1 in map(json.loads, log.read_text().splitlines())}
    assert len(spans) == 13, sorted(spans)
    a0, a1 = spans.pop("alone")
    beside = sorted(name for name, (t0, t1) in spans.items() if t0 < a1 and t1 > a0)
    assert beside == [], (beside, a0, a1, spans)
