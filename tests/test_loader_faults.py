"""Loader faults mid-run: a DataLoader worker SIGKILLed (naive, prefetch) and an operator error inside DALI's
threads. The run ends ``failed`` with one line naming the worker and the step, ``stallscope run`` exits 1, and
every step before the fault stays in a store that passes ``PRAGMA integrity_check`` and reports.

The killed worker is tests/data/scenarios/worker_kill.py's worker 1, which SIGKILLs itself after 40 items."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import torch
from torch import nn

from pipelines.augment import AugmentSpec
from pipelines.imagefolder import ImageFolderDataset
from profiler.cli import main
from profiler.core.steps.device_timers import resolve_device
from profiler.core.store import load_run
from profiler.drivers.runner import LoaderFailure, RunConfig, TrainingError, run_scenario
from scenarios import DataOptions, Scenario
from scenarios.datagen import make
from tests.conftest import ROOT, stallscope

WORKER_KILL = str(ROOT / "tests/data/scenarios/worker_kill.py")
STEP = re.compile(r"the loader failed at step (\d+) of \d+")


def _intact(out: Path) -> None:
    with sqlite3.connect(out / "run.sqlite") as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _kept_before(out: Path, step: int) -> None:
    """Every step before ``step`` is in the store (the one in flight may be too, ended where it stopped)."""
    recorded = [s.step for s in load_run(out).steps]
    assert recorded[:step] == list(range(step)) and len(recorded) <= step + 1


@pytest.mark.parametrize("pipeline", ["naive", "prefetch"])
def test_a_killed_worker_fails_the_run_naming_the_worker_and_the_step(
    tmp_path: Path, pipeline: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    res = stallscope("run", WORKER_KILL, "--pipeline", pipeline, "--workers", "2", "--no-attribution",
                     "--out", str(out), "--no-live", "--json", timeout=120)  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "Traceback" not in res.stderr
    failed = [ln for ln in res.stderr.splitlines() if "failed" in ln]
    assert len(failed) == 1, res.stderr
    line = failed[0]
    assert re.search(r"DataLoader worker 1 of 2 \(pid \d+\) was killed by SIGKILL", line), line
    found = STEP.search(line)
    assert found is not None and f"stallscope report {out}" in line
    step = int(found.group(1))
    assert step >= 2  # worker 1 dies after its 5th batch: the steps before came through
    summary = json.loads(res.stdout)
    assert summary["status"] == "failed" and summary["error"].startswith(f"the loader failed at step {step} ")
    _intact(out)
    _kept_before(out, step)
    assert main(["report", str(out)]) == 0  # in this process: the CLI itself is what the run above checked
    text = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the box wraps lines at any word
    assert "status=failed" in text and "killed by SIGKILL" in text and f"at step {step}" in text


class _Boom:
    """A DALI python_function that passes samples through until ``after`` of them, then raises."""

    def __init__(self, after: int) -> None:
        self.after, self.seen = after, 0

    def __call__(self, sample: object) -> object:
        self.seen += 1
        if self.seen > self.after:
            raise ValueError(f"injected failure after {self.after} samples")
        return sample


def test_a_dali_operator_error_fails_the_run_naming_the_threads_and_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("nvidia.dali")
    import pipelines.dali as dali_module

    augment = dali_module._augment  # the graph's last stage: the fault goes in after it

    def failing(dali: object, images: object, aug: AugmentSpec) -> object:
        return dali.fn.python_function(augment(dali, images, aug), function=_Boom(after=20))  # type: ignore[attr-defined]

    monkeypatch.setattr(dali_module, "_augment", failing)
    data = tmp_path / "images"
    make("imagenet-like", data, 24, classes=3, jobs=1)

    def dataset(options: DataOptions) -> ImageFolderDataset:
        return ImageFolderDataset.from_dir(options.root, AugmentSpec(size=32))

    def model() -> nn.Module:
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 3))

    scenario = Scenario(
        name="dali-fault",
        dataset=dataset,
        model=model,
        loss=nn.functional.cross_entropy,
        batch_size=4,
        steps=40,
        warmup=1,
        data="imagenet-like",
        data_count=24,
    )
    out = tmp_path / "run"
    cfg = RunConfig(out=out, device=resolve_device("cpu"), pipeline="dali", workers=2, data=data, attribution=False)
    with pytest.raises(TrainingError) as info:
        run_scenario(scenario, cfg)
    err = info.value
    assert isinstance(err.__cause__, LoaderFailure) and err.bad_input is None
    assert "\n" not in err.where
    assert re.search(
        r"DALI's worker threads \(in this process, pid \d+\) stopped in operator fn.python_function", err.where
    )
    assert "ValueError: injected failure after 20 samples" in err.where
    found = STEP.search(err.where)
    assert found is not None
    step = int(found.group(1))
    assert 1 <= step <= 5  # 20 samples are 5 batches of 4; DALI's queue may have met the error a batch or two early
    assert err.session is not None and err.session.status == "failed" and err.session.error == err.where
    _intact(out)
    _kept_before(out, step)
    capsys.readouterr()
    assert main(["report", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["error"] == err.where


class _RaisingItems(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """Worker 1 raises on its 3rd item (a corrupt record, a bug in the user's ``__getitem__``)."""

    def __init__(self) -> None:
        self.made = 0

    def __len__(self) -> int:
        return 512

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.id == 1:
            self.made += 1
            if self.made == 3:
                raise ValueError(f"cannot parse record {i}")
        return torch.full((4,), float(i % 7)), i % 3


def test_an_error_raised_in_a_worker_is_one_line_naming_the_worker_and_the_step(tmp_path: Path) -> None:
    """torch re-raises it as "Caught ValueError in DataLoader worker process 1." plus the worker's traceback;
    the run's error is one line: the worker, its pid, the error and where it was raised."""
    scenario = Scenario(name="raising", dataset=_RaisingItems, model=lambda: nn.Linear(4, 3),
                        loss=nn.functional.cross_entropy, batch_size=4, steps=50, warmup=1)  # fmt: skip
    cfg = RunConfig(out=tmp_path / "run", device=resolve_device("cpu"), workers=2, attribution=False)
    with pytest.raises(TrainingError) as info:
        run_scenario(scenario, cfg)
    err = info.value
    assert err.bad_input is None and "\n" not in err.where
    pattern = (
        r"the loader failed at step \d+ of 51 \(steps 0-\d+ are kept\): DataLoader worker 1 of 2 \(pid \d+\) "
        r"raised ValueError: cannot parse record \d+ \(at test_loader_faults.py:\d+ in __getitem__\)$"
    )
    assert re.match(pattern, err.where), err.where
    _intact(tmp_path / "run")


class _Proc:
    def __init__(self, pid: int, exitcode: int | None) -> None:
        self.pid, self.exitcode = pid, exitcode


def test_a_connection_lost_to_a_dying_worker_names_the_worker_that_ended() -> None:
    # the main process can read a ConnectionResetError from a worker killed mid-transfer before torch's SIGCHLD
    # handler raises its own error (seen once in CI): the worker that ended is then the failure
    from pipelines.naive import WatchedLoader

    loader = WatchedLoader(list(range(8)), batch_size=2)
    loader._watched = [_Proc(101, None), _Proc(102, -9)]  # type: ignore[attr-defined]
    told = loader.worker_failure(ConnectionResetError(104, "Connection reset by peer"))
    assert told is not None and told.startswith("DataLoader worker 1 of 2 (pid 102) was killed by SIGKILL")
    assert loader.worker_failure(EOFError()) == told
    loader._watched = [_Proc(101, None), _Proc(102, None)]  # type: ignore[attr-defined]
    assert loader.worker_failure(ConnectionResetError(104, "reset")) is None  # all alive: not a worker's death


def test_torchs_death_notice_while_a_lost_connection_waits_for_the_worker_is_not_a_second_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lost connection waits for the dying worker's exit status; torch's SIGCHLD handler may raise its own
    "is killed by signal" inside that wait (CI saw it escape as the run's error): the wait goes on and names it."""
    import signal as signals
    from types import SimpleNamespace

    from pipelines import naive

    dying = SimpleNamespace(pid=4242, exitcode=None)
    loader = naive.WatchedLoader(list(range(4)))
    loader._watched = [SimpleNamespace(pid=4241, exitcode=None), dying]

    def sleep(_s: float) -> None:  # the handler fires once the worker is reaped
        dying.exitcode = -signals.SIGKILL
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")

    monkeypatch.setattr(naive.time, "sleep", sleep)
    told = loader.worker_failure(ConnectionResetError(104, "Connection reset by peer"))
    assert told is not None and told.startswith("DataLoader worker 1 of 2 (pid 4242) was killed by SIGKILL"), told

    def other(_s: float) -> None:
        raise RuntimeError("something else")

    monkeypatch.setattr(naive.time, "sleep", other)
    dying.exitcode = None
    with pytest.raises(RuntimeError, match="something else"):  # not a worker's death: not swallowed
        loader.worker_failure(ConnectionResetError(104, "Connection reset by peer"))


def test_a_later_error_raised_while_closing_keeps_the_loader_failure_as_the_cause() -> None:
    """torch's SIGCHLD handler can raise a killed worker's death in any call after the watch stopped the workers: the
    failure the run said stays the cause (a fresh-clone CI found the late RuntimeError there instead)."""
    from profiler.drivers.runner import LoaderFailure, said_failure

    said = LoaderFailure("the loader failed at step 4 of 21: no batch came for 2 s")
    try:
        try:
            raise said
        except LoaderFailure:
            raise RuntimeError("DataLoader worker (pid 1) is killed by signal: Killed.") from None
    except RuntimeError as late:
        assert said_failure(late) is said
    plain = RuntimeError("no loader involved")
    assert said_failure(plain) is plain
