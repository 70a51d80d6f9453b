"""No step is lost at any step rate, and a live process is never called killed (issue #56): a loop faster than
the sampler process stores its steps (about 11,000 steps a second here, docs/benchmarks.md) leaves its records
spilled in the training process; the close hands every one into the ring before the sampler process's stdin
closes (a closed pipe is how it tells a Session dropped without a close). Before that, 100,000 steps of 80 us
stored 37,422-40,392 and the run read "interrupted ... (killed?)" with the process alive.

Since issue #65 such records go into new segments of the ring (shared memory the sampler process maps) rather than a
spill list in the training process, so a SIGKILL after the loop's last step loses none of them; where the ring
cannot grow, the report says how many steps were taken and how many are missing (before, 34,914 and 60,885 of
100,000 were stored, without a word)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, wait_until

from profiler import Session
from profiler.cli import main
from profiler.core.store import load_run, pid_alive, read_head

WORK = {"20us": lambda: sum(range(50)), "80us": lambda: sum(range(200)), "1ms": lambda: time.sleep(0.001)}


@pytest.mark.parametrize(
    ("steps", "rate"),
    [(1_000, "20us"), (20_000, "20us"), (100_000, "20us"), (1_000, "80us"), (20_000, "80us"), (100_000, "80us"),
     (1_000, "1ms"), (5_000, "1ms")],
)  # fmt: skip
def test_every_step_is_stored_and_the_run_complete(tmp_path: Path, steps: int, rate: str) -> None:
    work = WORK[rate]
    with Session(tmp_path, sample_hz=10, device="cpu", kernel_windows="off") as s:
        for _ in s.wrap(iter(range(steps))):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                work()
    run = load_run(tmp_path)
    assert run.meta["status"] == "complete" and run.meta.get("error") is None
    assert [st.step for st in run.steps] == list(range(steps))
    assert sum(1 for p in run.phases if p.name == "compute") == steps
    summary = s.summary()
    assert summary is not None and summary.steps == steps and summary.status == "complete"


# A Session loop of fast steps (WORK["20us"]) in a process of its own, on a ring of 256 KiB (about 1,000 such steps)
# so that the loop outruns the sampler process by many rings; argv: the run directory, the steps, and "spill" to
# keep the ring from growing (a full one then spills in the training process, where a kill takes it). It says
# "done" after its last step, inside the Session, and waits there to be killed. The 100,000 steps on a 1 MiB
# ring made 4 segments (2-16 MiB); 25,000 on 256 KiB make 4 as well (512 KiB-4 MiB), and the killed test's wait for
# the sampler process to drain them went from 21 to 6 s (docs/testing.md).
KILLED_LOOP = textwrap.dedent("""
    import sys, time
    from profiler import Session
    from profiler.core.sampler_process.ring import Ring, RingWriter
    made = Ring.create.__func__
    Ring.create = classmethod(lambda cls, size=0: made(cls, 1 << 18))
    if sys.argv[3] == "spill":
        RingWriter._grow = lambda self, record: False
    with Session(sys.argv[1], sample_hz=10, device="cpu", kernel_windows="off") as s:
        for _ in s.wrap(iter(range(int(sys.argv[2])))):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                sum(range(50))
        print("done", flush=True)
        time.sleep(600)
""")
KILLED_STEPS = 25_000


def _killed_after_its_last_step(out: Path, ring: str) -> None:
    """Run KILLED_LOOP, SIGKILL it after its last step, and wait for its sampler process to close the store."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_LOOP, str(out), str(KILLED_STEPS), ring],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"done\n"
        sampler = read_head(out)[0].get("sampler_pid")
        assert isinstance(sampler, int)
    finally:
        proc.kill()  # SIGKILL: nothing runs in the training process after it
        proc.wait()
    assert wait_until(lambda: not pid_alive(sampler), timeout=120)  # it drained what it could reach, and closed


def _report(out: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    """``stallscope report --json`` and the terminal report of ``out``, the latter's lines joined into one."""
    assert main(["report", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main(["report", str(out)]) == 0
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())
    return doc, text


def test_a_loop_killed_after_its_last_step_keeps_every_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ring grows (new segments the sampler process maps) where it used to spill in the training process: a
    kill after the loop's last step takes none of them (issue #65: 34,914 and 60,885 of 100,000 were stored)."""
    _killed_after_its_last_step(tmp_path, "grow")
    stored = load_run(tmp_path)
    assert [st.step for st in stored.steps] == list(range(KILLED_STEPS))
    assert stored.meta["status"] == "interrupted" and stored.meta["steps_taken"] == KILLED_STEPS
    doc, text = _report(tmp_path, capsys)
    assert doc["status"] == "interrupted" and doc["steps_taken"] == KILLED_STEPS and doc["steps_lost"] == 0
    assert f"the training process took {KILLED_STEPS:,} steps before it ended; all {KILLED_STEPS:,} are stored" in text


def test_a_killed_loop_whose_ring_could_not_grow_says_how_many_steps_are_lost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Where the ring cannot grow (no memory for a segment), a full one spills in the training process and a kill
    takes the spill: the store and the report say how many steps were taken and how many are missing."""
    _killed_after_its_last_step(tmp_path, "spill")
    stored = load_run(tmp_path)
    held = len(stored.steps)
    assert [st.step for st in stored.steps] == list(range(held)) and held < KILLED_STEPS  # the spill went with it
    assert stored.meta["status"] == "interrupted" and stored.meta["steps_taken"] == KILLED_STEPS
    doc, text = _report(tmp_path, capsys)
    assert doc["steps_taken"] == KILLED_STEPS and doc["steps_lost"] == KILLED_STEPS - held
    said = (
        f"the training process took {KILLED_STEPS:,} steps; the store holds {held:,}: {KILLED_STEPS - held:,} are "
        "missing (they had not reached the sampler process when the training process ended)"
    )
    assert said in text and said in doc["notes"]  # type: ignore[operator]
