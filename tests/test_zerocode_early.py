"""`stallscope run -- CMD` for a command that ends early (issue #66, items 3 and 4): one that fails at once gets one
line (its exit code; its own stderr is above it, unchanged), no verdict and no report, and py-spy's own errors go to
RUN/pyspy.log, not to the terminal; one stopped by Ctrl-C reports the steps that ran, exits as a shell would (130)
and gives no advice on py-spy's rate. Either run's directory is kept and `stallscope report` reads it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, stallscope, wait_until

# a py-spy that fails as the real one does on a process that is gone: its message, then a Rust backtrace, exit 1
# (`py-spy record --pid N` on a command that has exited: "No python processes found in process N ...")
FAKE_PYSPY = """#!{python}
import os, sys, time
pid = sys.argv[sys.argv.index("--pid") + 1]
def gone():
    try:
        with open(f"/proc/{{pid}}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except OSError:
        return True
deadline = time.monotonic() + 2.5  # within stallscope's 3 s attach window
while not gone() and time.monotonic() < deadline:
    time.sleep(0.01)
sys.stderr.write(f"Error: No python processes found in process {{pid}} or any of its subprocesses\\n\\n"
                 "Stack backtrace:\\n   0: anyhow::error::<impl anyhow::Error>::msg\\n"
                 "   1: py_spy::sampler::Sampler::new\\n")
sys.exit(1)
"""


def test_a_command_that_fails_at_once_gets_one_line_and_no_report(tmp_path: Path) -> None:
    spy = tmp_path / "py-spy"
    spy.write_text(FAKE_PYSPY.format(python=sys.executable))
    spy.chmod(0o755)
    out = tmp_path / "run"
    env_before = os.environ.get("STALLSCOPE_PYSPY")
    os.environ["STALLSCOPE_PYSPY"] = str(spy)
    try:
        res = stallscope("run", "--no-live", "--out", str(out), "--", sys.executable, "nosuch.py", cwd=tmp_path)
    finally:
        if env_before is None:
            del os.environ["STALLSCOPE_PYSPY"]
        else:
            os.environ["STALLSCOPE_PYSPY"] = env_before
    assert res.returncode == 1, res.stderr
    assert res.stdout == ""  # no report, no verdict
    mine = [ln for ln in res.stderr.splitlines() if ln.startswith("stallscope: ") and "nvml" not in ln]
    assert "can't open file" in res.stderr and "nosuch.py" in res.stderr  # the command's own stderr, as it wrote it
    assert mine[0].startswith("stallscope: profiling ")
    assert mine[1:] == [
        f"stallscope: the command exited with code 2 after {mine[1].split(' after ')[1].split(' s,')[0]} s, before "
        f"any DataLoader batch: no report (what was recorded: stallscope report {out})"
    ], res.stderr
    assert "Stack backtrace" not in res.stderr and "anyhow" not in res.stderr and "Verdict" not in res.stderr
    assert "anyhow::error" in (out / "pyspy.log").read_text()  # py-spy's own output, kept in the run directory
    report = stallscope("report", str(out), "--json")
    assert report.returncode == 0, report.stderr
    summary = json.loads(report.stdout)
    assert summary["command_exit_code"] == 2 and summary["status"] == "failed" and summary["steps"] == 0
    assert "--pyspy-rate" not in summary["verdict"]  # a run that failed needs no faster sampling


# a training loop whose batches take 200 ms (4 items asleep 50 ms each): it writes MARK after 6 batches, and the
# test then sends Ctrl-C to the whole process group as a terminal does; well before the 20 batches that pick the
# training loader of a run that goes on
LOOP = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

class Items(Dataset):
    def __len__(self):
        return 100_000
    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(4)

for step, batch in enumerate(DataLoader(Items(), batch_size=4, num_workers=0)):
    if step == 6:
        open(sys.argv[1], "w").close()
"""


def test_ctrl_c_early_reports_the_steps_that_ran_and_exits_130(tmp_path: Path) -> None:
    script, mark, out = tmp_path / "loop.py", tmp_path / "mark", tmp_path / "run"
    script.write_text(LOOP)
    args = [sys.executable, "-m", "profiler", "run", "--no-live", "--out", str(out), "--", sys.executable,
            str(script), str(mark)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert wait_until(mark.exists, timeout=120)
        # as `timeout -s INT` does it: stallscope, then its whole group (so stallscope gets it twice); a terminal's
        # Ctrl-C is the second alone
        os.kill(proc.pid, signal.SIGINT)
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, stderr[-3000:]
    assert "Traceback (most recent call last)" not in stderr.split("KeyboardInterrupt")[-1]  # the script's is its own
    assert "stopped by SIGINT; the command was ended by SIGINT (exit status 130); report of the" in stderr, stderr
    assert "code -2" not in stdout + stderr
    assert "--pyspy-rate" not in stdout + stderr and "sample faster" not in stdout + stderr
    summary = json.loads(stallscope("report", str(out), "--json").stdout)
    assert summary["status"] == "interrupted" and summary["mode"] == "auto-instrumented"
    # 7 batches or more ran (the mark), fewer than 20: every step between them is reported, the first as warm-up
    assert 5 <= summary["steps"] < 19, summary["steps"]
    assert summary["verdict"] == "highly input-bound"  # the loop waited for its items: measured, not estimated
    assert f"report of the {summary['steps']} steps measured follows" in stderr
    assert "was ended by SIGINT (exit status 130)" in stdout  # the report's command line, as a shell shows it


def test_pyspys_problem_line_quotes_its_message_without_the_backtrace(tmp_path: Path) -> None:
    from profiler.core.sampling.pyspy import attach_problem, exit_problem

    log = tmp_path / "pyspy.log"
    err = (
        "Error: Failed to get process executable name. Check that the process is running.\n\nCaused by:\n"
        "    0: Permission denied (os error 13)\n\nStack backtrace:\n   0: <E as anyhow::context::ext::StdError>::ext_"
        "context\n   1: py_spy::python_process_info::PythonProcessInfo::new\n"
    )
    line = attach_problem(err, log)
    assert "\n" not in line and "anyhow" not in line and "backtrace" not in line.lower()
    assert "ptrace_scope=0" in line and "os error 13" in line and line.endswith(f"(py-spy's output: {log})")
    ended = exit_problem(1, err, 3.4, log)
    assert ended.startswith("py-spy stopped at 3.4 s (exited with code 1: Error: Failed to get process executable")
    assert "anyhow" not in ended and f"its output: {log}" in ended
