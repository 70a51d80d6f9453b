"""The seed's CPU-vs-GPU scenarios (mlp-mnist, cnn-mnist, cifar-vgg, fasttext-imdb, bilstm-imdb).

Synthetic data: shapes, dtypes, label ranges and balance, determinism per (seed, index[, epoch]), cheap
construction, that the labels are learnable; the Keras models' shapes and parameter counts; and a few
steps of each through the real runner.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import scenarios
from profiler.core.steps.device_timers import resolve_device
from profiler.drivers.runner import RunConfig, run_scenario
from scenarios import cifar, mnist
from scenarios.base import Scenario
from scenarios.cifar import SCENARIO as CIFAR_VGG
from scenarios.cifar import CifarVGG, SyntheticCifar
from scenarios.imdb import BILSTM_IMDB, FASTTEXT_IMDB, VOCAB, BiLSTM, FastText, SyntheticReviews
from scenarios.mnist import CNN_MNIST, MLP_MNIST, MnistCNN, MnistMLP, SyntheticDigits


@dataclass(frozen=True)
class Case:
    scenario: Scenario
    small: Callable[..., Any]  # (length, seed=...) -> dataset
    shape: tuple[int, ...]
    dtype: torch.dtype
    classes: int
    epoch_length: int


CASES = {
    "mlp-mnist": Case(MLP_MNIST, SyntheticDigits, (1, 28, 28), torch.float32, 10, 60000),
    "cnn-mnist": Case(CNN_MNIST, SyntheticDigits, (1, 28, 28), torch.float32, 10, 60000),
    "cifar-vgg": Case(CIFAR_VGG, SyntheticCifar, (3, 32, 32), torch.float32, 10, 50000),
    "fasttext-imdb": Case(
        FASTTEXT_IMDB, lambda n, **kw: SyntheticReviews(n, maxlen=400, **kw), (400,), torch.int64, 2, 25000
    ),
    "bilstm-imdb": Case(
        BILSTM_IMDB, lambda n, **kw: SyntheticReviews(n, maxlen=100, **kw), (100,), torch.int64, 2, 25000
    ),
}
names = pytest.mark.parametrize("name", list(CASES))


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: these few small steps gain little from two, and on a busy host two OpenMP threads
    spin against other processes (measured on the 2-core host under load: 15 MLP steps 12.6 s with two)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@names
def test_registered_with_the_documented_defaults(name: str) -> None:
    case = CASES[name]
    sc = case.scenario
    assert scenarios.get(name) is sc and sc.name == name
    assert sc.synthetic is True
    assert sc.description and "\n" not in sc.description and "synthetic" in sc.description
    assert sc.batch_size == (128 if "mnist" in name else 32)
    assert sc.steps >= 1 and 0 <= sc.warmup < sc.steps
    assert sc.extra.get("data") or sc.extra.get("augmentation")


@names
def test_construction_is_cheap_and_an_epoch_long(name: str) -> None:
    # The template banks are cached per process: time a cold construction.
    mnist._padded_bank.cache_clear()
    cifar._shared_bank.cache_clear()
    # the CPU it costs, not the wall clock: beside the suite's other tests on two cores, a fresh-clone CI run's
    # mlp-mnist construction took 1.26 s of wall clock, waiting for a CPU
    start = time.process_time()
    dataset = CASES[name].scenario.dataset()
    assert time.process_time() - start < 1.0
    assert len(dataset) == CASES[name].epoch_length


@names
def test_items_have_the_documented_shape_dtype_and_labels(name: str) -> None:
    case = CASES[name]
    data = case.small(50)
    for index in (0, 1, 17, 49):
        x, y = data[index]
        assert x.shape == case.shape and x.dtype == case.dtype
        assert y.dtype == torch.int64 and y.ndim == 0 and 0 <= int(y) < case.classes
        if x.is_floating_point():
            assert float(x.min()) >= 0.0 and float(x.max()) <= 1.0
        else:
            assert int(x.min()) >= 0 and int(x.max()) < VOCAB
    with pytest.raises(IndexError):
        data[50]
    with pytest.raises(ValueError, match="length"):
        case.small(0)


@names
def test_labels_are_balanced(name: str) -> None:
    case = CASES[name]
    data = case.small(case.classes * 30)
    labels = [int(data[i][1]) for i in range(len(data))]
    assert np.bincount(labels, minlength=case.classes).tolist() == [30] * case.classes


@names
def test_items_are_deterministic_for_a_seed_and_independent_of_access_order(name: str) -> None:
    case = CASES[name]
    a, b = case.small(100, seed=3), case.small(100, seed=3)
    for index in (98, 7, 42):  # b is read in another order than a
        b[index - 1]
    for index in (7, 42, 99, 7):
        xa, ya = a[index]
        xb, yb = b[index]
        assert torch.equal(xa, xb) and int(ya) == int(yb)
    other = case.small(100, seed=4)
    assert not all(torch.equal(a[i][0], other[i][0]) for i in range(5))


def test_cifar_epoch_selects_the_augmentation_draw() -> None:
    data = SyntheticCifar(length=20, seed=1)
    epoch0 = [data[i][0] for i in range(8)]
    assert all(torch.equal(p, data[i][0]) for i, p in enumerate(epoch0))  # same epoch, same draw
    data.set_epoch(1)
    epoch1 = [data[i][0] for i in range(8)]
    # 7 x 7 shifts x 2 flips: an item may draw the same by chance, most may not.
    assert sum(torch.equal(p, q) for p, q in zip(epoch0, epoch1, strict=True)) <= 1
    data.set_epoch(0)
    assert all(torch.equal(p, data[i][0]) for i, p in enumerate(epoch0))


def test_cifar_augmentation_is_a_nearest_fill_shift_and_flip() -> None:
    on, off = SyntheticCifar(length=40, seed=2), SyntheticCifar(length=40, seed=2, augment=False)
    seen = set()
    for index in range(40):
        raw, label = off.raw(index)
        dy, dx, flip = on.shift_flip_params(index)
        seen.add((dy, dx, flip))
        assert -3 <= dy <= 3 and -3 <= dx <= 3
        x_on, y_on = on[index]
        assert int(y_on) == label
        assert torch.equal(off[index][0], torch.from_numpy(raw).permute(2, 0, 1).float() / 255)
        # Undo the augmentation on the interior (the border is edge fill) and compare with the raw image.
        img = (x_on.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
        if flip:
            img = img[:, ::-1]
        inner = img[3:-3, 3:-3]
        assert np.array_equal(inner, raw[3 - dy : 29 - dy, 3 - dx : 29 - dx])
    assert len({f for *_, f in seen}) == 2 and len(seen) > 20


def test_imdb_reviews_are_prepadded_and_pretruncated_like_keras() -> None:
    long, short = SyntheticReviews(200, maxlen=400), SyntheticReviews(200, maxlen=100)
    lengths = []
    for index in range(200):
        review, _ = long.review(index)
        lengths.append(len(review))
        assert review[0] == 1 and (review[1:] >= 3).all()  # START, then words only
        x400, x100 = long[index][0].numpy(), short[index][0].numpy()
        assert np.array_equal(x100, x400[-100:])  # the same review: a shorter maxlen shows its end
        if len(review) <= 400:
            assert np.array_equal(x400[400 - len(review) :], review) and (x400[: 400 - len(review)] == 0).all()
        else:
            assert np.array_equal(x400, review[-400:])
    # IMDB-like lengths: median ~180 words and a tail past 400.
    assert 140 < np.median(lengths) < 230 and max(lengths) > 400


def test_imdb_labels_are_carried_by_the_sentiment_words() -> None:
    """Counting own-class sentiment words, the rule the data is built on, classifies far above chance."""
    data = SyntheticReviews(400, maxlen=400)
    neg, pos = (np.isin(np.arange(VOCAB), data.sentiment[c]) for c in (0, 1))
    assert not (neg & pos).any()
    correct = 0
    for index in range(len(data)):
        x, y = data[index]
        ids = x.numpy()
        correct += int(pos[ids].sum() > neg[ids].sum()) == int(y)
    assert correct / len(data) > 0.8


def test_mnist_digits_are_learnable_not_noise() -> None:
    """A nearest-class-mean classifier on raw pixels must beat chance (10 %) by far (measured: 77 %)."""
    data = SyntheticDigits(length=1000, seed=0)
    images, labels = zip(*(data.raw(i) for i in range(len(data))), strict=True)
    x = np.stack(images).reshape(len(data), -1).astype(np.float32) / 255
    y = np.array(labels)
    train, test = slice(0, 800), slice(800, None)
    means = np.stack([x[train][y[train] == c].mean(0) for c in range(10)])
    predicted = ((x[test][:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == y[test]).mean() > 0.6


def test_cifar_scenes_are_learnable_not_noise() -> None:
    """Nearest class mean on raw pixels must beat chance (10 %) by far (measured: 85 %)."""
    data = SyntheticCifar(length=1000, seed=0, augment=False)
    images, labels = zip(*(data.raw(i) for i in range(len(data))), strict=True)
    x = np.stack(images).reshape(len(data), -1).astype(np.float32) / 255
    y = np.array(labels)
    train, test = slice(0, 800), slice(800, None)
    means = np.stack([x[train][y[train] == c].mean(0) for c in range(10)])
    predicted = ((x[test][:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == y[test]).mean() > 0.6


# Parameter counts: Keras's, except that torch's LSTM has two bias vectors per gate (+512) and the one sigmoid
# output of the IMDB models is two softmax logits here (+51 for fastText, +129 for the BiLSTM).
MODELS = {
    "mlp-mnist": (MnistMLP, (3, 1, 28, 28), 10, 669_706),
    "cnn-mnist": (MnistCNN, (3, 1, 28, 28), 10, 1_199_882),
    "cifar-vgg": (CifarVGG, (3, 3, 32, 32), 10, 1_250_858),
    "fasttext-imdb": (FastText, (3, 400), 2, 1_000_102),
    "bilstm-imdb": (BiLSTM, (3, 100), 2, 2_659_586),
}


@names
def test_models_match_the_keras_examples(name: str) -> None:
    factory, shape, classes, params = MODELS[name]
    model = factory()
    assert isinstance(model, type(CASES[name].scenario.model()))
    assert sum(p.numel() for p in model.parameters()) == params
    model.eval()
    x = torch.randint(0, VOCAB, shape) if len(shape) == 2 else torch.rand(shape)
    with torch.no_grad():
        assert model(x).shape == (3, classes)


def test_fasttext_mean_leaves_padding_out() -> None:
    model = FastText()
    ids = torch.tensor([[0, 0, 5, 9], [5, 9, 5, 9]])
    with torch.no_grad():
        pooled = model.embedding(ids)
    assert torch.allclose(pooled[0], pooled[1], atol=1e-6)


@pytest.mark.parametrize(
    ("name", "steps", "lr_batch"),
    [("mlp-mnist", 15, 64), ("cnn-mnist", 12, 32), ("cifar-vgg", 20, 32), ("fasttext-imdb", 25, 32)],
)
def test_sgd_steps_on_one_batch_reduce_the_loss(name: str, steps: int, lr_batch: int) -> None:
    """The scenario's own lr and the runner's SGD (momentum 0.9) fit one fixed batch: the models can learn."""
    sc = CASES[name].scenario
    data = CASES[name].small(lr_batch)
    torch.manual_seed(0)
    x = torch.stack([data[i][0] for i in range(lr_batch)])
    y = torch.stack([data[i][1] for i in range(lr_batch)])
    model = sc.model()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=sc.lr, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = sc.loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


@names
def test_a_few_steps_through_the_runner(name: str, tmp_path: Path) -> None:
    sc = CASES[name].scenario
    cfg = RunConfig(out=tmp_path / name, device=resolve_device("cpu"), batch_size=8, steps=3, warmup=1)
    session = run_scenario(sc, cfg)
    assert session.status == "complete"
    meta = session.meta
    assert meta["scenario"] == name and meta["batch_size"] == 8
    assert math.isfinite(meta["final_loss"])
