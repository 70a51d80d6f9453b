"""The warm interpreter the tests run ``stallscope`` through (tests/warm.py) behaves as a fresh one: the same
exit code, stdout and stderr, in the caller's working directory; a command whose environment differs where the
shared libraries care runs fresh."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import warm
from conftest import ROOT

COMMANDS = [
    ["frob"],  # bad input: argparse's one line, exit 2
    ["run", "--pipeline", "frob"],  # ours: one line naming the allowed values, exit 2
    ["report", "runs/nosuch"],  # a relative path: resolved in the caller's directory
    ["report", str(ROOT / "tests" / "data" / "runs" / "cpu-workers"), "--json"],  # a report on stdout
]


def _run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(argv, cwd=cwd, env=full, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a)[:30])
def test_a_warm_command_prints_and_exits_as_a_fresh_one(tmp_path: Path, args: list[str]) -> None:
    assert warm.socket_path() is not None  # the suite runs warm unless STALLSCOPE_TEST_COLD=1
    warm_res = _run(warm.argv(args), tmp_path)
    cold_res = _run(warm.argv(args), tmp_path, STALLSCOPE_TEST_COLD="1")
    assert (warm_res.returncode, warm_res.stdout, warm_res.stderr) == (
        cold_res.returncode,
        cold_res.stdout,
        cold_res.stderr,
    )


def test_an_environment_the_libraries_read_differently_runs_fresh(tmp_path: Path) -> None:
    # a sitecustomize on the command's own PYTHONPATH runs only in a fresh interpreter: the warm one started
    # before it, so the command must not be forked from it
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text("import sys\nprint('fresh interpreter', file=sys.stderr)\n")
    res = _run(warm.argv(["frob"]), tmp_path, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path / 'site'}")
    assert res.returncode == 2 and res.stderr.splitlines()[0] == "fresh interpreter"
    assert warm.sensitive({"PYTHONPATH": "a", "OMP_NUM_THREADS": "1", "HOME": "/root"}) == {
        "PYTHONPATH": "a",
        "OMP_NUM_THREADS": "1",
    }  # HOME does not matter to the libraries


def test_the_server_stays_in_the_tests_session_so_its_commands_share_its_scheduling_group() -> None:
    # where the kernel groups processes by session for scheduling (sched_autogroup), a server in a session of its
    # own gave its commands as much CPU as every other process of the run together: a tune measured there against
    # a grid measured inside the test read two computing workers as x0.95 of none, the grid x1.6 (a stress pass)
    import psutil

    path = warm.socket_path()
    assert path is not None
    servers = [p for p in psutil.process_iter(["cmdline"]) if path in (p.info["cmdline"] or [])]
    assert servers, path
    for server in servers:
        assert os.getsid(server.pid) == os.getsid(0)
        assert os.getpgid(server.pid) != os.getpgid(0)  # a Ctrl-C at the terminal is not sent to it
