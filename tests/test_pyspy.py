"""py-spy process handling without py-spy: failure lines say why and how to fix it; a missing binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.core.pyspy import PySpyRecorder, attach_problem


@pytest.mark.parametrize(
    ("stderr", "needles"),
    [
        ("Error: Permission denied (os error 13)", ["ptrace_scope=0", "SYS_PTRACE", "root"]),
        ("Error: Operation not permitted (os error 1)", ["ptrace_scope=0", "SYS_PTRACE"]),
        ("Error: Failed to find python version from target process", ["no Python interpreter"]),
        ("Error: No such process (os error 3)", ["exited before py-spy could attach"]),
        ("", ["exited without output"]),
    ],
)
def test_attach_problems_say_why_and_how_to_fix(stderr: str, needles: list[str]) -> None:
    line = attach_problem(stderr)
    assert "\n" not in line
    for needle in needles:
        assert needle in line


def test_missing_pyspy_is_a_reason_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STALLSCOPE_PYSPY", str(tmp_path / "no-such-py-spy"))
    rec = PySpyRecorder(pid=1, out=tmp_path / "out.json")
    problem = rec.start()
    assert problem is not None and "pip install py-spy" in problem
    assert rec.stop() == problem  # stopping a recorder that never started is harmless


def test_rate_out_of_range_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"allowed 1\.\.1000"):
        PySpyRecorder(pid=1, out=tmp_path / "x", rate=5000).start()
