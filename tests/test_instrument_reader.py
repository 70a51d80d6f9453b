"""The start-up module's records turned into steps (profiler.zerocode.instrument.InstrumentReader), from
hand-written record files: every expected figure is counted from the records the test writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from profiler.zerocode.boot.stallscope_instrument import DIR_ENV, OVERRIDES_ENV, STOP_ENV
from profiler.zerocode.instrument import LOCK_CALLS, InstrumentReader, TrialStop, child_env


def write(directory: Path, pid: int, records: list[dict[str, Any]], *, tail: str = "") -> None:
    with open(directory / f"p{pid}.jsonl", "a") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in records) + tail)


def loader(lid: int, line: int, workers: int = 2) -> dict[str, Any]:
    args = {"num_workers": workers, "pin_memory": False, "batch_size": 8, "sampler": "RandomSampler"}
    return {"k": "loader", "id": lid, "file": "/src/train.py", "line": line, "args": args, "applied": {}}


def calls(lid: int, starts: list[float], wait: float, n: int = 8, q: int | None = None) -> list[dict[str, Any]]:
    """next() records starting at ``starts``, each waiting ``wait`` s; run-queue readings 1 ms per second."""
    out = []
    for t in starts:
        rec: dict[str, Any] = {"k": "next", "id": lid, "t0": t, "t1": t + wait, "n": n}
        if q is not None:
            rec.update(q0=int(t * 1e6), q1=int((t + wait) * 1e6))
        out.append(rec)
    return out


def test_steps_run_from_one_next_call_to_the_next(tmp_path: Path) -> None:
    starts = [10.0 + 0.1 * i for i in range(LOCK_CALLS + 1)]
    iter_rec = {"k": "iter", "id": 1, "t0": 9.9, "t1": 9.95, "q0": int(9.9e6)}
    write(tmp_path, 7, [{"k": "proc", "pid": 7}, loader(1, 57), iter_rec, *calls(1, starts, 0.03, q=1)])
    reader = InstrumentReader(tmp_path, t0=9.0)
    steps = reader.poll()
    assert len(steps) == LOCK_CALLS  # the last call's step has no end yet
    first, second = steps[0][0], steps[1][0]
    # the epoch's first step starts at iter() (the workers start there) and its wait includes it
    assert first.t_start == pytest.approx(0.9) and first.t_end == pytest.approx(1.1)
    assert first.data_wait_s == pytest.approx(10.03 - 9.9) and first.warmup
    assert second.t_start == pytest.approx(1.1) and second.data_wait_s == pytest.approx(0.03) and not second.warmup
    assert second.samples == 8
    # the run-queue readings (1 ms per second here): the wait's and the whole step's
    assert second.data_wait_runq_s == pytest.approx(0.03e-3, abs=2e-9)
    assert second.runq_s == pytest.approx(0.1e-3, abs=2e-9)
    (phase,) = steps[1][1]
    assert phase.name == "compute" and phase.t_start == pytest.approx(1.13) and phase.t_end == pytest.approx(1.2)
    assert phase.runq_s == pytest.approx(0.07e-3, abs=2e-9)
    facts = reader.facts()
    assert facts["loader_site"] == "train.py:57" and facts["workers"] == 2 and facts["batch_size"] == 8
    assert facts["schedstat"] == "available"


def test_an_epochs_end_closes_its_last_step_and_iter_opens_the_next(tmp_path: Path) -> None:
    epoch1 = calls(1, [1.0 + 0.1 * i for i in range(LOCK_CALLS)], 0.01)
    end = {"k": "end", "id": 1, "t0": 3.0, "t1": 3.05}
    # validation between epochs: outside every step, as under Session.wrap
    epoch2 = [{"k": "iter", "id": 1, "t0": 5.0, "t1": 5.2}, *calls(1, [5.2, 5.3], 0.02)]
    write(tmp_path, 7, [loader(1, 57), *epoch1, end, *epoch2])
    steps = [row for row, _ in InstrumentReader(tmp_path, t0=0.0).poll()]
    assert len(steps) == LOCK_CALLS + 1
    assert steps[LOCK_CALLS - 1].t_end == pytest.approx(3.0)  # the StopIteration call's start
    assert steps[LOCK_CALLS].t_start == pytest.approx(5.0) and steps[LOCK_CALLS].t_end == pytest.approx(5.3)
    assert steps[LOCK_CALLS].data_wait_s == pytest.approx(5.22 - 5.0)


def test_another_loader_iterated_inside_a_step_is_its_own_phase(tmp_path: Path) -> None:
    train = calls(1, [1.0 + i for i in range(LOCK_CALLS + 1)], 0.1)
    val = calls(2, [3.3, 3.4, 3.5], 0.05)  # inside step 2: 3.0 .. 4.0, its batch arrived at 3.1
    records = [loader(1, 57), loader(2, 80), *train[:3], *val, *train[3:]]
    write(tmp_path, 7, records)
    steps = {row.step: phases for row, phases in InstrumentReader(tmp_path, t0=0.0).poll()}
    names = [(p.name, round(p.t_start, 3), round(p.t_end, 3)) for p in steps[2]]
    assert names == [("compute", 3.1, 3.3), ("loader train.py:80", 3.3, 3.55), ("compute", 3.55, 4.0)]
    assert all(p.runq_s is None for p in steps[2])  # split compute: no single run-queue reading pair


def test_a_sanity_check_pass_over_another_loader_first_does_not_take_the_training_loader(tmp_path: Path) -> None:
    sanity = calls(2, [0.1, 0.2], 0.01)  # Lightning's default: 2 validation batches before training
    train = calls(1, [10.0 + 0.1 * i for i in range(LOCK_CALLS + 1)], 0.01)
    write(tmp_path, 7, [loader(2, 80), loader(1, 57), *sanity, *train[: LOCK_CALLS - 1]])
    reader = InstrumentReader(tmp_path, t0=0.0)
    assert reader.poll() == []  # no loader has LOCK_CALLS calls yet
    write(tmp_path, 7, train[LOCK_CALLS - 1 :])
    steps = reader.poll()
    assert len(steps) == LOCK_CALLS and reader.facts()["loader_site"] == "train.py:57"
    assert "instrument_note" not in reader.facts()


def test_a_training_loader_taken_too_early_is_said(tmp_path: Path) -> None:
    # a long pass over another loader before training reaches LOCK_CALLS first: the run says so
    first = calls(2, [0.1 * i for i in range(LOCK_CALLS + 1)], 0.01)
    train = calls(1, [10.0 + 0.1 * i for i in range(3 * LOCK_CALLS)], 0.01)
    write(tmp_path, 7, [loader(2, 80), loader(1, 57), *first])
    reader = InstrumentReader(tmp_path, t0=0.0)
    reader.poll()
    write(tmp_path, 7, train)
    reader.poll()
    facts = reader.facts()
    assert facts["loader_site"] == "train.py:80"
    assert "train.py:57 ended with more next() calls (60)" in facts["instrument_note"]


def test_rank_zero_gives_the_steps_and_a_partial_or_damaged_line_costs_nothing_else(tmp_path: Path) -> None:
    for pid, rank in ((11, 1), (10, 0)):
        write(tmp_path, pid, [{"k": "proc", "pid": pid, "rank": rank}, loader(1, 57)])
        write(tmp_path, pid, calls(1, [float(i) for i in range(LOCK_CALLS + rank * 10)], 0.5 + rank / 10))
    write(tmp_path, 10, [], tail='{"k": "next", "id": 1, "t0": 99.0, "t1": 99.5, "n"')  # being written
    reader = InstrumentReader(tmp_path, t0=0.0)
    steps = reader.poll()
    assert len(steps) == LOCK_CALLS - 1 and all(r.data_wait_s == pytest.approx(0.5) for r, _ in steps)
    with open(tmp_path / "p10.jsonl", "a") as fh:
        fh.write(': 8}\nnot json\n{"k": "next", "id": 1, "t0": 100.0, "t1": 100.5, "n": 8}\n')
    more = reader.poll()
    assert [(r.t_start, r.t_end) for r, _ in more] == [(19.0, 99.0), (99.0, 100.0)]


def test_child_env_puts_the_boot_directory_first_and_says_what_to_change(tmp_path: Path) -> None:
    env = child_env(tmp_path, base={"PYTHONPATH": "/a:/b"}, overrides={"num_workers": 4}, stop=TrialStop(30))
    first, *rest = env["PYTHONPATH"].split(":")
    assert Path(first, "sitecustomize.py").is_file() and rest == ["/a", "/b"]
    assert env[DIR_ENV] == str(tmp_path) and json.loads(env[OVERRIDES_ENV]) == {"num_workers": 4}
    assert env[STOP_ENV] == "30" and TrialStop(None, 2.5, 24).env() == ",2.5,24"
    assert OVERRIDES_ENV not in child_env(tmp_path, base={}) and STOP_ENV not in child_env(tmp_path, base={})


def test_under_a_launcher_the_steps_wait_for_rank_zero(tmp_path: Path) -> None:
    # rank 1 reaches LOCK_CALLS first: its steps must not become the run's
    write(
        tmp_path,
        11,
        [{"k": "proc", "pid": 11, "rank": 1}, loader(1, 57), *calls(1, [float(i) for i in range(30)], 0.2)],
    )
    write(
        tmp_path, 10, [{"k": "proc", "pid": 10, "rank": 0}, loader(1, 57), *calls(1, [float(i) for i in range(5)], 0.1)]
    )
    reader = InstrumentReader(tmp_path, t0=0.0)
    assert reader.poll() == [] and reader.source is None
    write(tmp_path, 10, calls(1, [float(i) for i in range(5, 30)], 0.1))
    steps = reader.poll()
    assert reader.source is not None and reader.source.pid == 10
    assert len(steps) == 29 and all(r.data_wait_s == pytest.approx(0.1) for r, _ in steps)
