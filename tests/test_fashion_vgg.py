"""The built-in ``fashion-vgg`` scenario: synthetic data, augmentation, determinism and the model spec."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import stallscope
from torch import nn

from profiler.analysis.stages import COVERED
from profiler.core.store import load_run
from scenarios.fashion_vgg import MEAN, NUM_CLASSES, SCENARIO, STD, FashionVGG, SyntheticFashion


@pytest.fixture(scope="module")
def ds() -> SyntheticFashion:
    return SyntheticFashion(length=640, seed=0)


def test_construction_is_cheap_and_length_configurable() -> None:
    start = time.perf_counter()
    default = SyntheticFashion()
    assert time.perf_counter() - start < 1.0
    assert len(default) == 12800
    assert len(SyntheticFashion(length=37)) == 37
    with pytest.raises(ValueError, match="length"):
        SyntheticFashion(length=0)


def test_items_have_the_documented_shape_dtype_and_labels(ds: SyntheticFashion) -> None:
    for index in (0, 1, 17, len(ds) - 1):
        x, y = ds[index]
        assert x.shape == (1, 28, 28) and x.dtype == torch.float32
        assert y.dtype == torch.int64 and y.ndim == 0
        assert 0 <= int(y) < NUM_CLASSES
        assert torch.isfinite(x).all()
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_labels_are_balanced(ds: SyntheticFashion) -> None:
    labels = [ds.raw(i)[1] for i in range(len(ds))]
    assert np.bincount(labels, minlength=NUM_CLASSES).tolist() == [64] * NUM_CLASSES


def test_items_are_deterministic_for_a_seed_and_independent_of_access_order() -> None:
    a, b = SyntheticFashion(length=100, seed=3), SyntheticFashion(length=100, seed=3)
    for index in (42, 7, 99):  # b is read in a different order from a
        b[index - 1]
    for index in (7, 42, 99):
        xa, ya = a[index]
        xb, yb = b[index]
        assert torch.equal(xa, xb) and int(ya) == int(yb)
    other = SyntheticFashion(length=100, seed=4)
    assert not all(torch.equal(a[i][0], other[i][0]) for i in range(5))


def test_epoch_selects_the_augmentation_draw() -> None:
    data = SyntheticFashion(length=20, seed=1)
    epoch0 = [data[i][0] for i in range(5)]
    data.set_epoch(1)
    epoch1 = [data[i][0] for i in range(5)]
    assert not any(torch.equal(p, q) for p, q in zip(epoch0, epoch1, strict=True))
    data.set_epoch(0)
    assert all(torch.equal(p, data[i][0]) for i, p in enumerate(epoch0))


def test_augmentation_changes_pixels_and_off_only_normalises() -> None:
    on = SyntheticFashion(length=50, seed=2, augment=True)
    off = SyntheticFashion(length=50, seed=2, augment=False)
    for index in range(8):
        raw, label = off.raw(index)
        expected = (torch.from_numpy(raw).float().unsqueeze(0) / 255 - MEAN) / STD
        x_off, y_off = off[index]
        assert torch.allclose(x_off, expected, atol=1e-6)
        x_on, y_on = on[index]
        assert int(y_on) == int(y_off) == label
        # A ±10° / ±10 % / 0.9-1.1 affine moves many pixels, not a few.
        assert (x_on - x_off).abs().gt(0.1).float().mean() > 0.01
        params = on.affine_params(index)
        assert -10 <= params["angle"] <= 10 and 0.9 <= params["scale"] <= 1.1
        assert all(abs(t) <= 3 for t in params["translate"])


def test_data_is_learnable_not_noise() -> None:
    """A nearest-class-mean classifier on raw pixels must beat chance by far."""
    data = SyntheticFashion(length=1000, seed=0, augment=False)
    images, labels = zip(*(data.raw(i) for i in range(len(data))), strict=True)
    x = np.stack(images).reshape(len(data), -1).astype(np.float32) / 255
    y = np.array(labels)
    train, test = slice(0, 800), slice(800, None)
    means = np.stack([x[train][y[train] == c].mean(0) for c in range(NUM_CLASSES)])
    predicted = ((x[test][:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == y[test]).mean() > 0.6


def test_model_shape_and_layer_counts() -> None:
    model = FashionVGG()
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)

    def count(kind: type[nn.Module]) -> int:
        return sum(isinstance(m, kind) for m in model.modules())

    assert count(nn.Conv2d) == 9
    assert count(nn.Linear) == 3
    assert count(nn.BatchNorm2d) == 2 and count(nn.BatchNorm1d) == 2
    assert count(nn.MaxPool2d) == 2
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.25, 0.25, 0.25, 0.5, 0.5]
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert [c.out_channels for c in convs] == [32, 32, 64, 64, 128, 128, 256, 256, 256]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) for c in convs)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(256 * 7 * 7, 512), (512, 512), (512, 10)]


def test_sgd_steps_reduce_the_loss() -> None:
    torch.manual_seed(0)
    data = SyntheticFashion(length=16, seed=0, augment=False)
    x = torch.stack([data[i][0] for i in range(16)])
    y = torch.stack([data[i][1] for i in range(16)])
    model = SCENARIO.model()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=SCENARIO.lr, momentum=0.9)
    losses = []
    for _ in range(8):
        loss = SCENARIO.loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_scenario_fields() -> None:
    assert SCENARIO.name == "fashion-vgg"
    assert SCENARIO.batch_size == 64
    assert SCENARIO.synthetic is True
    assert SCENARIO.description and "\n" not in SCENARIO.description
    assert SCENARIO.steps >= 1 and 0 <= SCENARIO.warmup < SCENARIO.steps
    assert isinstance(SCENARIO.dataset(), SyntheticFashion)
    assert isinstance(SCENARIO.model(), FashionVGG)


def _loaded_per_s(run: Path, trained_per_s: float) -> float:
    """The items the worker fetched a second over the measured window (the fetch counter's first and last readings
    in it): the loader's own rate, which a short window's training rate differs from as the prefetched batches fill
    (the training's rate where the counter gives none)."""
    rec = load_run(run)
    measured = [s for s in rec.steps if not s.warmup]
    lo, hi = measured[0].t_start, measured[-1].t_end
    # a reading with no value is None: the sampler writes a NaN as None (and SQLite would store one as NULL)
    counts = [(t, v) for t, _src, m, v in rec.samples if m == "stage.fetch.n" and v is not None and lo <= t <= hi]
    if len(counts) < 2 or not counts[-1][0] > counts[0][0] or not counts[-1][1] > counts[0][1]:
        return trained_per_s
    (t0, n0), (t1, n1) = counts[0], counts[-1]
    return (n1 - n0) / (t1 - t0)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_stage_table_covers_the_loaders_time_or_gives_no_capacity(tmp_path: Path, workers: int) -> None:
    """Issue #66 item 2: the augmentation was not timed, and the capacity left it out (150 times too high). Every
    stage of an item is timed now; the timed stages per item against the loader's time per item measured apart from
    them in the same run (0 workers: the data wait per item; 1 worker: its busy time, all but its wait for work,
    per item it loaded, with each batch's hand-off): 80% or more of it, or no capacity figure at all."""
    res = stallscope(
        "run", "fashion-vgg", "--steps", "4", "--warmup", "1", "--batch-size", "16", "--workers", str(workers),
        "--no-attribution", "--no-live", "--json", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    st = summary["stages"]
    timed = {s["name"]: s["ms_per_item"] for s in st["stages"]}
    assert {"fetch", "decode", "augment", "collate"} <= set(timed), timed
    if workers == 0:
        loader_ms = summary["breakdown_ms_per_step"]["data_wait"] / 16
    else:
        busy = sum(100.0 - p["queue"] for p in summary["loader_time"]["processes"] if p["label"] != "main")
        loader_ms = 10.0 * busy / _loaded_per_s(tmp_path / "run", summary["throughput_samples_per_s"])
    assert st["loader_ms_per_item"] == pytest.approx(loader_ms, rel=1e-6)
    # with a worker, each batch's hand-off to the training process is timed and counted beside the stages
    handoff = st["handoff_ms_per_item"] or 0.0
    assert (st["handoff_ms_per_item"] is not None) is (workers > 0), st
    covered = (sum(timed.values()) + handoff) / loader_ms
    story = f"timed {timed} + hand-off {handoff:.3f} of {loader_ms:.3f} ms an item ({covered:.0%}): {st['headline']}"
    assert st["coverage"] == pytest.approx(covered, rel=1e-6), story
    if covered >= COVERED:
        capacity = max(1, workers) * 1e3 / (sum(timed.values()) + handoff)
        assert st["capacity_samples_per_s"] == pytest.approx(capacity), story
    else:
        assert st["capacity_samples_per_s"] is None and "no capacity is given" in st["headline"], story
        assert all(s["capacity_samples_per_s"] is None for s in st["stages"]), story
