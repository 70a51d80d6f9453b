"""CLI outputs of issue #5: report --html/--trace files and compare's exit codes, on recorded runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import stallscope

RUNS = Path(__file__).parent / "data" / "runs"


@pytest.fixture
def runs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("cpu-workers", "nvml-fake", "interrupted"):
        shutil.copytree(RUNS / name, tmp_path / name)
        out[name] = tmp_path / name
    return out


def test_report_writes_html_and_trace(runs: dict[str, Path], tmp_path: Path) -> None:
    html, trace = tmp_path / "r.html", tmp_path / "r.trace.json"
    res = stallscope("report", str(runs["interrupted"]), "--html", str(html), "--trace", str(trace), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["status"] == "interrupted"  # stdout is still the summary alone
    assert f"wrote {html}" in res.stderr and f"wrote {trace}" in res.stderr
    page = html.read_text()
    assert page.lstrip().lower().startswith("<!doctype html>") and "interrupted" in page
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e["ph"] == "X" for e in events)


def test_report_html_to_an_unwritable_place_is_bad_input(runs: dict[str, Path], tmp_path: Path) -> None:
    res = stallscope("report", str(runs["cpu-workers"]), "--html", str(tmp_path / "no" / "such" / "dir.html"))
    assert res.returncode == 2
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--html" in lines[0] and "Traceback" not in res.stderr


def test_compare_exit_codes(runs: dict[str, Path]) -> None:
    a, b = str(runs["cpu-workers"]), str(runs["nvml-fake"])  # B: ~64% lower throughput, +58 pp stall
    same = stallscope("compare", a, a, "--max-throughput-drop", "1", "--max-stall-increase", "1")
    assert same.returncode == 0, same.stdout
    assert "no regression" in same.stdout.lower()
    worse = stallscope("compare", a, b, "--max-throughput-drop", "10")
    assert worse.returncode == 1
    assert "throughput dropped" in worse.stdout
    assert stallscope("compare", a, b, "--max-throughput-drop", "70").returncode == 0
    assert stallscope("compare", a, b, "--max-stall-increase", "50").returncode == 1
    assert stallscope("compare", a, b, "--max-stall-increase", "60").returncode == 0
    assert stallscope("compare", a, b).returncode == 0  # no limit, no gate
    better = stallscope("compare", b, a, "--max-throughput-drop", "0", "--max-stall-increase", "0", "--json")
    assert better.returncode == 0 and json.loads(better.stdout)["regressed"] is False


def test_compare_bad_input(runs: dict[str, Path], tmp_path: Path) -> None:
    res = stallscope("compare", str(runs["cpu-workers"]), str(tmp_path / "missing"))
    assert res.returncode == 2 and "does not exist" in res.stderr
    res = stallscope("compare", str(runs["cpu-workers"]), str(runs["nvml-fake"]), "--max-stall-increase", "-1")
    assert res.returncode == 2 and "allowed 0..100" in res.stderr
