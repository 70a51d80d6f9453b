"""The Lightning integration against injected truth: a real Trainer, a tiny module, items that sleep a known time.

The data wait stallscope records must be within 5% of what the dataset's sleeps really took (timed by the test,
0 loader workers, Lightning's sized loader: no prefetch, so each step's wait is its own batch's items).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import ROOT, Truth
from torch import nn
from torch.utils.data import DataLoader, Dataset, default_collate

from profiler.analysis import summarize
from profiler.core.store import load_run
from profiler.integrations.base import rank_endpoint
from profiler.integrations.lightning import StallscopeCallback, StallscopeProfiler, pl

BATCH, ITEM_S, STEPS, WARMUP = 8, 0.004, 20, 2


class Items(Dataset[tuple[torch.Tensor, int]]):
    """``n`` items, each ``__getitem__`` sleeping ``ITEM_S``; each whole call is timed into ``truth``, in order."""

    def __init__(self, n: int, truth: Truth) -> None:
        self.n, self.truth = n, truth

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        t0 = time.perf_counter()
        time.sleep(ITEM_S)
        item = torch.full((4,), float(i % 5)), i % 3
        self.truth.spent.setdefault("item", []).append(time.perf_counter() - t0)  # the whole item, as it ran
        return item

    def __getitems__(self, indices: list[int]) -> list[tuple[torch.Tensor, int]]:
        """The batch's fetch as torch's fetcher makes it (its items one by one), its start noted for :meth:`collate`."""
        self.truth.spent.setdefault("fetch_start", []).append(time.perf_counter())
        return [self[i] for i in indices]

    def collate(self, items: list[tuple[torch.Tensor, int]]) -> Any:
        """The default collate, timed: the batch's whole load, from its first item to the batch built, is truth."""
        batch = default_collate(items)
        self.truth.spent.setdefault("batch", []).append(time.perf_counter() - self.truth.spent["fetch_start"][-1])
        return batch


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, fail_at: int = -1) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.fail_at = fail_at

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx == self.fail_at:
            raise RuntimeError("injected failure in training_step")
        x, y = batch
        return nn.functional.cross_entropy(self.lin(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Validated(Tiny):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.lin(batch[0])


def _fit(
    profiler: Any = None,
    callbacks: list[Any] | None = None,
    fail_at: int = -1,
    steps: int = STEPS + WARMUP,
    validate: bool = False,
) -> tuple[Truth, Any]:
    """Fit ``Tiny`` on ``steps`` batches of sleeping items; the truth of the training items, or with
    ``validate`` of the validation items (2 batches at the end of the epoch, after a sanity check of 1)."""
    truth = Truth()
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        profiler=profiler,
        callbacks=callbacks or [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=1,
    )
    items = Items(BATCH * steps, truth)
    loader = DataLoader(items, batch_size=BATCH, num_workers=0, collate_fn=items.collate)
    if validate:
        val_truth = Truth()
        val_items = Items(BATCH * 2, val_truth)
        val = DataLoader(val_items, batch_size=BATCH, num_workers=0, collate_fn=val_items.collate)
        trainer.fit(Validated(), loader, val)
        return val_truth, trainer
    trainer.fit(Tiny(fail_at), loader)
    return truth, trainer


def _check_truth(run_dir: Path, truth: Truth) -> None:
    record = load_run(run_dir)
    steps = record.steps
    assert len(steps) == STEPS + WARMUP and sum(s.warmup for s in steps) == WARMUP
    assert all(s.samples == BATCH for s in steps)
    items = truth.spent["item"]
    assert len(items) == BATCH * (STEPS + WARMUP)
    # the truth is each batch's whole load as torch's fetcher made it, from its first item's start to the collated
    # batch: the items' sleeps alone missed what a busy host adds between them (CI: 0.996 s recorded against
    # 0.933 s of item sleeps, the training thread waiting for a CPU 73% of its compute time)
    batches = truth.spent["batch"]
    assert len(batches) == STEPS + WARMUP
    injected = sum(batches[WARMUP:])
    assert injected >= sum(items[BATCH * WARMUP :])  # the items are inside their batches' loads
    measured = sum(s.data_wait_s for s in steps if not s.warmup)
    assert abs(measured - injected) <= 0.05 * injected, (measured, injected)
    names = {p.name for p in record.phases}
    assert {"h2d", "compute"} <= names, names
    summary = summarize(record)
    assert summary.status == "complete" and summary.steps == STEPS
    assert summary.batch_size == BATCH and summary.workers == 0
    assert summary.scenario == "Tiny" and summary.pipeline == "lightning"


def test_profiler_form_records_the_injected_data_wait(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    prof = StallscopeProfiler(tmp_path / "run", warmup=WARMUP, sources=[])
    truth, _ = _fit(profiler=prof)
    _check_truth(tmp_path / "run", truth)
    assert (tmp_path / "run" / "summary.json").is_file()
    assert prof.session is not None and prof.session.meta["integration"] == "lightning-profiler"
    assert "stallscope report" in capsys.readouterr().out  # the report, printed at the end of fit


def test_callback_form_records_the_same_and_keeps_the_users_profiler(tmp_path: Path) -> None:
    cb = StallscopeCallback(tmp_path / "run", warmup=WARMUP, sources=[], report=False)
    truth, trainer = _fit(profiler="simple", callbacks=[cb])
    _check_truth(tmp_path / "run", truth)
    assert type(trainer.profiler).__name__ == "SimpleProfiler"  # put back at teardown
    assert "[_TrainingEpochLoop].train_dataloader_next" in trainer.profiler.recorded_durations  # and it saw every call


def test_a_validation_run_inside_fit_is_a_phase_of_the_step_it_ran_in(tmp_path: Path) -> None:
    prof = StallscopeProfiler(tmp_path / "run", sources=[], report=False)
    val_truth, _ = _fit(profiler=prof, steps=4, validate=True)
    record = load_run(tmp_path / "run")
    assert len(record.steps) == 4
    val = [p for p in record.phases if p.name == "validation"]
    assert [p.step for p in val] == [3]  # the epoch's last step; the sanity check ran before any step
    items = val_truth.spent["item"]
    assert len(items) == BATCH * 3  # the sanity check's batch, then the run's two
    injected = sum(items[BATCH:])
    took = val[0].t_end - val[0].t_start
    assert injected <= took <= 1.3 * injected + 0.02, (took, injected)


def test_a_fit_that_raises_keeps_its_steps_and_says_failed(tmp_path: Path) -> None:
    prof = StallscopeProfiler(tmp_path / "run", sources=[], report=False)
    with pytest.raises(RuntimeError, match="injected failure"):
        _fit(profiler=prof, fail_at=5)
    record = load_run(tmp_path / "run")
    assert record.meta["status"] == "failed"
    assert "injected failure in training_step" in record.meta["error"]
    assert len(record.steps) >= 5  # the steps before the failure, and the one that failed


def _stand_in_fit(cb: StallscopeCallback, world: int, rank: int, steps: int = 3) -> Any:
    """Lightning's calls for ``steps`` training steps, on a stand-in trainer (no processes launched)."""
    trainer = SimpleNamespace(
        world_size=world,
        global_rank=rank,
        local_rank=rank,
        node_rank=0,
        num_nodes=1,
        lightning_module=None,
        strategy=SimpleNamespace(root_device=torch.device("cpu")),
        profiler=pl.profilers.PassThroughProfiler(),
    )
    cb.setup(trainer, None, "fit")
    for _ in range(steps):
        trainer.profiler.start("[_TrainingEpochLoop].train_dataloader_next")
        trainer.profiler.stop("[_TrainingEpochLoop].train_dataloader_next")
        with trainer.profiler.profile("run_training_batch"):
            pass
    trainer.profiler.stop("run_training_epoch")
    cb.teardown(trainer, None, "fit")
    return trainer


def test_each_rank_of_a_larger_world_writes_its_own_store(tmp_path: Path) -> None:
    """Rank 1 of a world of 2 writes RUN_DIR/rank-1 with the rank keys."""
    trainer = _stand_in_fit(StallscopeCallback(tmp_path / "job", sources=[], report=False), world=2, rank=1)
    assert isinstance(trainer.profiler, pl.profilers.PassThroughProfiler)
    record = load_run(tmp_path / "job" / "rank-1")
    assert len(record.steps) == 3
    assert (record.meta["rank"], record.meta["world_size"], record.meta["local_rank"]) == (1, 2, 1)
    assert not (tmp_path / "job" / "rank-0").exists()


def test_a_second_fit_is_recorded_in_a_store_of_its_own(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cb = StallscopeCallback(tmp_path / "run", sources=[], report=False)
    _stand_in_fit(cb, world=1, rank=0, steps=3)
    _stand_in_fit(cb, world=1, rank=0, steps=2)
    assert len(load_run(tmp_path / "run").steps) == 3
    assert len(load_run(tmp_path / "run-2").steps) == 2
    assert "holds an earlier training; this one is recorded in" in caplog.text


class _Scraper(pl.Callback):  # type: ignore[misc]
    """Scrapes the fit's own endpoint from a hook, after ``at`` training batches (the fit is still running)."""

    def __init__(self, prof: StallscopeProfiler, at: int) -> None:
        self.prof, self.at, self.text, self.url = prof, at, "", ""

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.at:
            exporter = self.prof.session.exporter if self.prof.session is not None else None
            assert exporter is not None
            self.url = exporter.url  # the bound port (the exporter forgets it when it closes)
            self.text = urllib.request.urlopen(self.url, timeout=10).read().decode()


def test_prometheus_serves_the_fit_while_it_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``StallscopeProfiler(prometheus=0)``: a free port serves the fit's figures while it trains, said on stderr;
    the port is closed with the fit. A bad value fails where the profiler is made, one line naming it."""
    from prometheus_client.parser import text_string_to_metric_families

    prof = StallscopeProfiler(tmp_path / "run", warmup=WARMUP, sources=[], report=False, prometheus=0)
    scraper = _Scraper(prof, at=WARMUP + 5)
    _fit(prof, callbacks=[scraper], steps=WARMUP + 8)
    got = {s.name: s.value for f in text_string_to_metric_families(scraper.text) for s in f.samples}
    assert 0 < got["stallscope_steps_total"] < WARMUP + 8, got
    assert got["stallscope_measured_steps_total"] > 0 and got["stallscope_data_wait_seconds_total"] > 0
    assert 0 < got["stallscope_run_stall_ratio"] <= 1
    url = scraper.url
    assert f"stallscope: Prometheus metrics at {url}" in capsys.readouterr().err
    with pytest.raises(OSError):  # closed with the fit
        urllib.request.urlopen(url, timeout=2)
    with pytest.raises(ValueError, match=r"'70000'.*allowed PORT or ADDR:PORT"):
        StallscopeCallback(tmp_path / "bad", prometheus=70000)
    assert str(rank_endpoint("0.0.0.0:9464", 1)) == "0.0.0.0:9465" and rank_endpoint(0, 3).port == 0


def test_a_prometheus_port_in_use_is_one_line_and_the_fit_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port is known to be taken only when fit starts: one line on stderr, the fit trains on and is recorded
    as without the endpoint, and ``stallscope report`` reads the store. What can be checked when the profiler is
    made (a missing prometheus_client) raises there, before any training."""
    import socket

    from conftest import stallscope

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        prof = StallscopeProfiler(tmp_path / "run", warmup=WARMUP, sources=[], report=False, prometheus=port)
        _fit(prof, steps=WARMUP + 4)
    finally:
        taken.close()
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("stallscope:")]
    assert err == [
        f"stallscope: prometheus=127.0.0.1:{port}: cannot listen there (Address already in use): allowed a free "
        f"port on an address of this host; training goes on, recorded in {tmp_path / 'run'} without the endpoint"
    ], err
    record = load_run(tmp_path / "run")
    assert record.meta["status"] == "complete" and len(record.steps) == WARMUP + 4
    assert record.meta["prometheus"].startswith(f"not served: prometheus=127.0.0.1:{port}: cannot listen")
    report = stallscope("report", str(tmp_path / "run"))
    assert report.returncode == 0 and "Tiny" in report.stdout, report.stderr
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "prometheus_client" else 1)
    with pytest.raises(ImportError, match=r"^prometheus=9464 needs the prometheus_client package: pip install"):
        StallscopeProfiler(tmp_path / "never", prometheus=9464)


def test_the_callback_leaves_lightning_only_the_step_hook_it_uses(tmp_path: Path) -> None:
    """Lightning calls a callback's callable hooks through the profiler several times a step: the unused ones are
    None (Lightning skips them); a subclass that overrides one keeps it. ``on_train_batch_end`` logs to the
    Trainer's loggers at its logging steps: None with ``loggers=False``."""

    class Mine(StallscopeCallback):
        def on_before_backward(self, *args: Any) -> None:
            pass

    cb, prof = StallscopeCallback(tmp_path / "a", loggers=False), StallscopeProfiler(tmp_path / "b", loggers=False)
    for hooks in (cb, prof._hooks):
        assert hooks.on_before_backward is None and hooks.on_train_batch_end is None
        assert callable(hooks.on_train_batch_start) and callable(hooks.on_exception)
    mine = Mine(tmp_path / "c")
    assert callable(mine.on_before_backward) and mine.on_after_backward is None
    assert callable(mine.on_train_batch_end) and callable(StallscopeCallback(tmp_path / "d").on_train_batch_end)


def test_without_lightning_the_import_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning"):
        monkeypatch.setitem(sys.modules, name, None)  # a None entry makes `import name` raise ImportError
    monkeypatch.delitem(sys.modules, "profiler.integrations.lightning")
    with pytest.raises(ImportError) as err:
        importlib.import_module("profiler.integrations.lightning")
    assert str(err.value) == (
        "stallscope's PyTorch Lightning integration needs lightning or pytorch-lightning: "
        "pip install 'stallscope[lightning]'"
    )


SCRIPT = """
import pytorch_lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from profiler.analysis import summarize
from profiler.integrations.lightning import StallscopeProfiler, pl

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
    def training_step(self, batch, i):
        return torch.nn.functional.cross_entropy(self.lin(batch[0]), batch[1])
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = TensorDataset(torch.randn(32, 4), torch.randint(0, 3, (32,)))
L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
          enable_model_summary=False, profiler=StallscopeProfiler("run", sources=[], report=False)).fit(
    M(), DataLoader(data, batch_size=8))
print(pl.__name__)
"""


def test_a_program_on_pytorch_lightning_gets_its_classes(tmp_path: Path) -> None:
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "pytorch_lightning"
    assert len(load_run(tmp_path / "run").steps) == 4
