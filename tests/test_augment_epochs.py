"""--augment-epochs: augmentation for the first N epochs only, then plain data (the Keras fashion-MNIST seed)."""

from __future__ import annotations

from pathlib import Path

import torch

from scenarios.cifar import SCENARIO as CIFAR
from scenarios.fashion_vgg import SyntheticFashion
from tests.conftest import stallscope


def test_augmentation_stops_after_n_epochs() -> None:
    aug = SyntheticFashion(64)
    plain = SyntheticFashion(64, augment=False)
    aug.augment_epochs = 2
    for epoch, augmented in ((0, True), (1, True), (2, False), (5, False)):
        aug.set_epoch(epoch)
        plain.set_epoch(epoch)
        same = all(torch.equal(aug[i][0], plain[i][0]) for i in range(8))
        assert same is not augmented, epoch
    aug.augment_epochs = None  # the default: every epoch augmented
    aug.set_epoch(5)
    assert not all(torch.equal(aug[i][0], plain[i][0]) for i in range(8))


def test_cifar_supports_it_too() -> None:
    ds = CIFAR.dataset()
    ds.augment_epochs = 0
    again = CIFAR.dataset()
    again.augment = False
    assert all(torch.equal(ds[i][0], again[i][0]) for i in range(4))


def test_cli_augment_epochs(tmp_path: Path) -> None:
    ok = stallscope("run", "fashion-vgg", "--augment-epochs", "0", "--steps", "1", "--warmup", "0",
                    "--batch-size", "8", "--no-live", "--json", "--out", str(tmp_path / "a"))  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    bad = stallscope("run", "mlp-mnist", "--augment-epochs", "1", "--steps", "1", "--no-live",
                     "--out", str(tmp_path / "b"))  # fmt: skip
    assert bad.returncode == 2
    errors = [ln for ln in bad.stderr.splitlines() if "error" in ln]
    assert len(errors) == 1 and "no switchable augmentation" in errors[0]
    neg = stallscope("run", "fashion-vgg", "--augment-epochs", "-1", "--out", str(tmp_path / "c"))
    assert neg.returncode == 2 and "out of range" in neg.stderr
