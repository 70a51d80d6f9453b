"""Zero-code profiling of an unmodified script: the estimate against the script's own measured data wait,
worker attribution, the child's exit code and output, attach, and a py-spy that cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, stallscope

EXAMPLE = str(ROOT / "examples" / "train.py")


def test_estimate_is_within_5pp_of_the_scripts_own_figure(tmp_path: Path) -> None:
    truth_file = tmp_path / "truth.json"
    res = stallscope(
        "run", "--json", "--no-live", "--no-instrument", "--pyspy-rate", "100", "--out", str(tmp_path / "run"),
        "--", sys.executable, EXAMPLE, "--steps", "320", "--batch-size", "8", "--workers", "0", "--read-ms", "0",
        "--truth", str(truth_file),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)  # stdout holds only the summary ...
    assert "step 0 loss" in res.stderr  # ... the script's own output went to stderr
    truth = json.loads(truth_file.read_text())["data_wait_fraction_after_first_step"]  # the estimate's span
    est = summary["stack_estimate"]["overall"]
    # 800-1,600 samples at 100 Hz (240 steps of 8: half the images of 120 steps of 32, the same share of data wait;
    # 100 steps of 32 gave 488 on CI, below the 500 the bound was set for; 240 steps gave 404 on a fast quiet host
    # on 2026-11-27: now 320): sampling
    # sd ~2 pp, so 5 pp is ~2.5 sd. py-spy pauses the process to read it: read without a pause, stacks that
    # changed mid-read were lost, mostly from data wait, and the estimate read 1-7 points low (docs/zero-code.md)
    assert est["samples"] >= 500
    assert abs(est["data_wait"]["fraction"] - truth) <= 0.05, (est["data_wait"], truth)
    assert summary["mode"] == "zero-code" and summary["command_exit_code"] == 0
    assert summary["workers"] == 0 and summary["loader_attribution"] is None
    assert summary["steps"] == 0 and summary["throughput_samples_per_s"] is None  # not guessed
    assert any("zero-code run" in n for n in summary["notes"])
    if truth >= 0.2:
        assert summary["verdict"] == "highly input-bound"
        assert "RAISE_WORKERS" in [r["code"] for r in summary["recommendations"]]


def test_workers_are_attributed(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = stallscope(
        "run", "--no-live", "--pyspy-rate", "25", "--out", str(out),
        "--", sys.executable, EXAMPLE, "--steps", "60", "--read-ms", "0",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "Loader workers' CPU (2 worker(s)" in res.stdout
    summary = json.loads(stallscope("report", str(out), "--json").stdout)
    att = summary["loader_attribution"]
    assert att["workers"] == 2 and att["active"] > 50
    cats = att["categories"]
    # the example's workers JPEG-decode and augment (crop, resize, flip, normalise): most of their CPU
    assert cats["decode"]["fraction"] + cats["augment"]["fraction"] > 0.6, cats
    assert any(f["function"].startswith("ImageFile.load") for f in cats["decode"]["top"])


def test_failing_command_exit_code_is_reported(tmp_path: Path) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import time\nprint('working', flush=True)\ntime.sleep(1.5)\nraise SystemExit(3)\n")
    res = stallscope("run", "--json", "--no-live", "--out", str(tmp_path / "run"), "--", sys.executable, str(script))
    assert res.returncode == 1
    assert "exited with code 3" in res.stderr and "working" in res.stderr
    summary = json.loads(res.stdout)
    assert summary["command_exit_code"] == 3 and summary["status"] == "failed"


def test_without_pyspy_the_sampler_only_run_completes(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    own = tmp_path / "own.txt"  # the script's own CPU share over its busy loop: process_time / wall
    script.write_text(
        "import time\nt0, c0 = time.time(), time.process_time()\nend = t0 + 1.5\nwhile time.time() < end:\n"
        f"    pass\nopen({str(own)!r}, 'w').write(str(100 * (time.process_time() - c0) / (time.time() - t0)))\n"
    )
    env_before = os.environ.get("STALLSCOPE_PYSPY")
    os.environ["STALLSCOPE_PYSPY"] = "/bin/false"  # a py-spy that fails at once
    try:
        res = stallscope(
            "run", "--json", "--no-live", "--out", str(tmp_path / "run"), "--", sys.executable, str(script)
        )
    finally:
        if env_before is None:
            del os.environ["STALLSCOPE_PYSPY"]
        else:
            os.environ["STALLSCOPE_PYSPY"] = env_before
    assert res.returncode == 0, res.stderr
    assert "sampler only" in res.stderr
    summary = json.loads(res.stdout)
    assert summary["status"] == "complete" and summary["stack_estimate"] is None
    assert summary["sampler"]["samples"] >= 5
    # the busy loop, seen by psutil: ~100% of a core when idle, >= ~35% beside four other busy processes on 2 cores,
    # 6.5% at load 15 (a fresh-clone CI): against the script's own share of a core in the same run, which the
    # sampler's mean also holds the interpreter's start and exit in (a share of the 1.5 s loop's, lower or higher)
    script_pct = float(own.read_text())
    assert summary["host"]["proc_main_cpu_pct_mean"] > 0.5 * script_pct, (script_pct, summary["host"])


def test_attach_to_a_running_script(tmp_path: Path) -> None:
    target = subprocess.Popen(
        [sys.executable, EXAMPLE, "--steps", "100000", "--workers", "0"], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        # attach once it is in its training loop: it prints "step 0 loss" after its first step (a fixed 6 s wait
        # was not enough on a busy host, and the attach then sampled start-up instead of training)
        assert target.stdout is not None
        assert "step 0 loss" in target.stdout.readline()
        res = stallscope(
            "attach",
            str(target.pid),
            "--duration",
            "5",
            "--json",
            "--no-live",
            "--pyspy-rate",
            "25",
            "--out",
            str(tmp_path / "run"),
        )
        assert res.returncode == 0, res.stderr
        summary = json.loads(res.stdout)
        assert summary["mode"] == "zero-code" and summary["command_exit_code"] is None
        assert summary["stack_estimate"]["overall"]["samples"] >= 50
        assert target.poll() is None  # attaching and detaching left it running
    finally:
        target.kill()
        target.wait()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--"], "nothing after `--`"),
        (["run", "--", "/no/such/program"], "cannot start '/no/such/program'"),
        (["attach", "999999"], "pid 999999 is not a running process"),
        (["run", "fashion-vgg", "--", "python", "x.py"], "not both"),
    ],
)
def test_zero_code_bad_input(args: list[str], needle: str, tmp_path: Path) -> None:
    res = stallscope(*args, "--out", str(tmp_path / "o")) if args[0] == "attach" else stallscope(*args)
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr and "Traceback" not in res.stderr
