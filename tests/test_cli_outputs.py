"""CLI outputs of issue #5: report --html/--trace files and compare's exit codes, on recorded runs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from html import escape as html_escape
from pathlib import Path
from typing import Any

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


# --- issue #66, items 6 and 7: messages that point the right way, words a newcomer can read ---


def _one_line(res: subprocess.CompletedProcess[str]) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_a_file_that_is_not_a_run_is_named_so_and_a_truncated_store_is_still_corrupt(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    text = tmp_path / "fv1.out"
    text.write_text("stallscope: training fashion-vgg (naive, device cpu) -> runs/fv1\n")
    line = _one_line(stallscope("report", str(text)))
    assert (
        f"'{text}' is not a stallscope run: expected a run directory holding run.sqlite, or a run.sqlite file" in line
    )
    assert "corrupt" not in line
    # a real store cut short, under any name, is still a damaged run
    db = (runs["cpu-workers"] / "run.sqlite").read_bytes()
    cut = tmp_path / "copy.sqlite"
    cut.write_bytes(db[:3000])
    assert "is corrupt or truncated" in _one_line(stallscope("report", str(cut)))


def test_an_unknown_flag_names_the_subcommands_help_and_the_nearest_flag() -> None:
    line = _one_line(stallscope("run", "fashion-vgg", "--stpes", "20"))
    assert line == (
        "stallscope run: error: unrecognized arguments: --stpes 20: did you mean --steps? (see stallscope run --help)"
    )
    line = _one_line(stallscope("report", "x", "--jsn"))
    assert "did you mean --json?" in line and "(see stallscope report --help)" in line
    # nothing near: no guess
    line = _one_line(stallscope("compare", "a", "b", "--zzzzzz"))
    assert "did you mean" not in line and line.endswith("(see stallscope compare --help)")


def test_the_sweep_header_of_a_command_names_what_it_swept(tmp_path: Path) -> None:
    from profiler.sweep.analysis import SweepRow, analyse_sweep

    def row(workers: int, rate: float, role: str) -> SweepRow:
        times = {"mean": 8 / rate * 1e3, "p50": 8 / rate * 1e3, "p90": 8 / rate * 1e3}
        return SweepRow("script", 64, workers, "complete", throughput_samples_per_s=rate, step_time_ms=times,
                        steps=40, role=role)  # fmt: skip

    result = analyse_sweep([row(0, 606.5, "own"), row(2, 741.8, "sweep")],
                           scenario=".venv/bin/python main.py --epochs 1", device="chosen by the command", planned=2,
                           status="complete")  # fmt: skip
    (tmp_path / "sweep.json").write_text(json.dumps(result.to_dict()))
    res = stallscope("report", str(tmp_path))
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.split())
    assert "Sweep of `python main.py --epochs 1`: workers 0, 2 (device chosen by the command): 2 of 2" in flat
    assert "on chosen by the command" not in flat


@pytest.fixture(scope="module")
def words_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A short run of a built-in scenario with a loader worker: stages, loader time, memory and contention."""
    out = tmp_path_factory.mktemp("words") / "run"
    res = stallscope("run", "mlp-mnist", "--steps", "4", "--warmup", "1", "--workers", "1", "--no-live",
                     "--out", str(out), "--json")  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    return out, json.loads(res.stdout)


def test_the_report_words_are_plain_or_in_its_legend(words_run: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    out, summary = words_run
    html = tmp_path / "r.html"
    res = stallscope("report", str(out), "--html", str(html))
    assert res.returncode == 0, res.stderr
    flat = " ".join(res.stdout.replace("│", " ").split())  # the words, without the panel's borders
    for jargon in ("lateness p95", "read cost", "schedstat run delay", "phase boundaries", "with 1 loader process"):
        assert jargon not in flat, jargon
    assert "Terms: p50 / p90 / p95" in flat and "docs/metrics.md" in flat
    # one phrase for where the loader ran, and a ratio with the precision it deserves
    if summary["stages"] is not None:
        assert "in 1 worker process" in flat and "0 workers" not in flat
        assert not re.search(r"headroom x\d+\.\d\d", flat), flat
        page = " ".join(html.read_text().split())
        assert page.count(html_escape(summary["stages"]["headline"])) == 1  # the sentence once, not twice
    if "USS start" in flat:  # the memory table is shown (a run long enough to read each process's memory)
        assert "USS: memory only that process holds" in flat
    if (summary["contention"] or {}).get("available"):
        assert "ms/step; schedstat at each phase's start and end)" in flat
        assert "schedstat: the kernel's count of the time a thread was runnable but not on a CPU" in flat
    # the missing GPU said once, among the sampler's sources
    nvml = summary["sampler"]["sources"].get("nvml", "")
    if nvml.startswith("unavailable"):
        word = max(nvml.split(), key=len)  # the reason's longest word ("NVMLError_LibraryNotFound"): it never wraps
        assert flat.count(word) == 1, flat


def test_a_zero_code_run_that_ends_normally_counts_no_read_errors(tmp_path: Path) -> None:
    script = tmp_path / "spin.py"
    script.write_text("import time\nt = time.time()\nwhile time.time() - t < 2:\n    sum(range(10000))\n")
    res = stallscope("run", "--no-live", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert res.returncode == 0, res.stderr[-3000:]
    assert "ended: process" in res.stdout  # the sources that followed the process saw it exit
    assert "read errors" not in res.stdout, res.stdout
    doc = json.loads((tmp_path / "run" / "summary.json").read_text())
    ended = [k for k, v in doc["sampler"]["sources"].items() if str(v).startswith("ended")]
    assert ended and all(doc["sampler"]["errors"].get(k, 0) == 0 for k in ended), doc["sampler"]
