"""Image-folder source, augmentation spec and bad-data handling, down to the CLI's exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.augment import Affine, AugmentSpec
from pipelines.base import LoaderSpec
from pipelines.imagefolder import (
    BadSampleError,
    DataSourceError,
    ImageFolderDataset,
    ImageFolderSource,
    check_file,
)
from pipelines.naive import NaivePipeline
from tests.conftest import stallscope


def _jpeg(path: Path, w: int, h: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    img = np.stack([(x * 255 // w), (y * 255 // h), np.full((h, w), rng.integers(0, 255))], axis=-1)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(img.astype(np.uint8)).save(path, quality=90)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "imgs"
    for c in range(3):
        for i in range(4):
            _jpeg(root / f"class_{c}" / f"{i:03d}.jpg", 96 + 8 * i, 80 + 4 * c, seed=c * 10 + i)
    return root


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_scan_lists_files_with_labels_by_sorted_class(folder: Path) -> None:
    src = ImageFolderSource.scan(folder)
    assert src.classes == ("class_0", "class_1", "class_2")
    assert len(src.files) == 12
    assert src.labels == tuple(c for c in range(3) for _ in range(4))
    assert all(Path(f).parent.name == f"class_{label}" for f, label in zip(src.files, src.labels, strict=True))
    assert src.bad == ()


def test_check_file_tells_truncated_and_non_images(folder: Path) -> None:
    good = folder / "class_0" / "000.jpg"
    assert check_file(good) is None
    _truncate(good)
    assert check_file(good) == "truncated JPEG (no end-of-image marker)"
    text = folder / "class_0" / "notes.jpg"
    text.write_text("not a picture")
    assert "not an image" in (check_file(text) or "")
    empty = folder / "class_0" / "empty.jpg"
    empty.write_bytes(b"")
    assert check_file(empty) == "empty file"


@pytest.mark.parametrize(
    ("make_bad", "reason"),
    [
        (lambda root: _truncate(root / "class_1" / "002.jpg"), "truncated JPEG"),
        (lambda root: (root / "class_2" / "zz.jpg").write_text("hello"), "not an image"),
        (lambda root: (root / "class_2" / "README.txt").write_text("hello"), "not an image (extension '.txt')"),
    ],
)
def test_bad_file_fails_naming_it_or_is_skipped_and_listed(folder: Path, make_bad, reason: str) -> None:
    make_bad(folder)
    with pytest.raises(BadSampleError) as err:
        ImageFolderSource.scan(folder, "fail")
    msg = str(err.value)
    assert msg.startswith("bad sample ") and reason in msg and "\n" not in msg
    src = ImageFolderSource.scan(folder, "skip")
    assert len(src.bad) == 1 and reason in src.bad[0].reason
    assert src.bad[0].path not in src.files


def test_missing_empty_and_imageless_directories_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match="does not exist"):
        ImageFolderSource.scan(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DataSourceError, match="is not a directory"):
        ImageFolderSource.scan(tmp_path / "file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataSourceError, match="no class subdirectories"):
        ImageFolderSource.scan(tmp_path / "empty")
    (tmp_path / "empty" / "cls").mkdir()
    with pytest.raises(DataSourceError, match="no usable image"):
        ImageFolderSource.scan(tmp_path / "empty")
    with pytest.raises(ValueError, match="on_bad_sample"):
        ImageFolderSource.scan(tmp_path, "ignore")


def test_subset_is_balanced_and_deterministic(folder: Path) -> None:
    src = ImageFolderSource.scan(folder).subset(6)
    assert sorted(src.labels) == [0, 0, 1, 1, 2, 2]
    assert src == ImageFolderSource.scan(folder).subset(6)


def test_augment_spec_validates_and_describes() -> None:
    with pytest.raises(ValueError, match="crop"):
        AugmentSpec(crop="square")
    with pytest.raises(ValueError, match="flip_p"):
        AugmentSpec(flip_p=2)
    with pytest.raises(ValueError, match="mean/std"):
        AugmentSpec(grayscale=True)
    spec = AugmentSpec(size=64)
    det = spec.deterministic()
    assert (det.crop, det.flip_p, det.affine, det.size) == ("center", 0.0, None, 64)
    assert det.resize_shorter == 73 and AugmentSpec(size=224, crop="center").resize_shorter == 256
    assert "random-resized-crop 64" in spec.describe() and "flip p=0.5" in spec.describe()
    gray = AugmentSpec(size=28, grayscale=True, mean=(0.5,), std=(0.5,), affine=Affine(), crop="center", resize=0)
    assert "affine ±10°" in gray.describe() and gray.channels == 1


def test_dataset_items_follow_the_spec(folder: Path) -> None:
    ds = ImageFolderDataset.from_dir(folder, AugmentSpec(size=48))
    x, y = ds[5]
    assert x.shape == (3, 48, 48) and x.dtype == torch.float32 and y.dtype == torch.int64 and int(y) == 1
    # normalised with ImageNet statistics: a 0..1 image maps into roughly -2.2..2.7
    assert float(x.min()) >= -2.2 and float(x.max()) <= 2.7
    gray = ImageFolderDataset.from_dir(
        folder, AugmentSpec(size=28, grayscale=True, mean=(0.5,), std=(0.5,), affine=Affine(), crop="center")
    )
    assert gray[0][0].shape == (1, 28, 28)


def _corrupt_body(path: Path) -> None:
    """Valid start and end markers, garbage in between: passes the scan, fails to decode."""
    data = bytearray(path.read_bytes())
    data[20:-2] = bytes(len(data) - 22)
    path.write_bytes(bytes(data))


def test_decode_failure_after_the_scan_follows_the_policy(folder: Path) -> None:
    bad = folder / "class_1" / "001.jpg"
    _corrupt_body(bad)
    assert check_file(bad) is None  # the cheap scan cannot see it: the decode must
    spec = LoaderSpec(batch_size=4, workers=0, shuffle=False)
    fail = NaivePipeline().build(ImageFolderDataset.from_dir(folder, AugmentSpec(size=32), "fail"), spec)
    with pytest.raises(BadSampleError, match=r"001\.jpg"):
        list(fail.batches)
    skip_ds = ImageFolderDataset.from_dir(folder, AugmentSpec(size=32), "skip")
    built = NaivePipeline().build(skip_ds, spec)
    sizes = [int(x.shape[0]) for x, _ in built.batches]
    assert sizes == [4, 3, 4]  # the bad item is dropped from its batch, not replaced
    assert built.skips is not None and [b.path for b in built.skips.skipped] == [str(bad)]
    meta = built.skips.to_meta()
    assert meta["policy"] == "skip" and meta["skipped"] == 1 and meta["files"][0]["path"] == str(bad)


def test_decode_failure_in_a_worker_reaches_the_main_process_naming_the_file(folder: Path) -> None:
    _corrupt_body(folder / "class_2" / "003.jpg")
    spec = LoaderSpec(batch_size=4, workers=1, shuffle=False)
    built = NaivePipeline().build(ImageFolderDataset.from_dir(folder, AugmentSpec(size=32), "fail"), spec)
    with pytest.raises(BadSampleError, match=r"003\.jpg"):
        list(built.batches)


# --- through the CLI: exit 2 naming the file (fail), the summary listing it (skip) ---------------------------


@pytest.mark.slow
def test_cli_bad_sample_fail_exits_2_naming_the_file(folder: Path, tmp_path: Path) -> None:
    _truncate(folder / "class_0" / "001.jpg")
    r = stallscope("run", "imagenet", "--data", str(folder), "--steps", "1", "--warmup", "0", "--no-live",
                   "--out", str(tmp_path / "run"), "--loader-only", "--batch-size", "4")  # fmt: skip
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert len(lines) == 1 and "001.jpg" in lines[0] and "truncated JPEG" in lines[0]
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_cli_bad_sample_skip_is_counted_and_listed(folder: Path, tmp_path: Path) -> None:
    _truncate(folder / "class_0" / "001.jpg")
    _corrupt_body(folder / "class_1" / "002.jpg")
    out = tmp_path / "run"
    r = stallscope("run", "imagenet", "--data", str(folder), "--steps", "2", "--warmup", "0", "--no-live",
                   "--out", str(out), "--loader-only", "--batch-size", "4", "--on-bad-sample", "skip",
                   "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    bad = summary["bad_samples"]
    assert bad["policy"] == "skip"
    listed = {Path(f["path"]).name for f in bad["files"]}
    assert "001.jpg" in listed  # found by the scan; 002.jpg is listed only if its batch was drawn
    assert bad["skipped"] == len(bad["files"]) >= 1
    assert summary["loader_only"] is True and summary["verdict"].startswith("loader only")
    report = stallscope("report", str(out))
    flat = "".join(report.stdout.replace("│", "").split())  # the panel wraps long paths
    assert "badsamples" in flat and "001.jpg" in flat


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--data", "/nonexistent/dir"], "--data '/nonexistent/dir' does not exist"),
        (["--model", "resnet9"], "unknown model 'resnet9'"),
        (["--on-bad-sample", "ignore"], "invalid choice: 'ignore'"),
        (["--price-per-hour", "-1"], "out of range"),
    ],
)
def test_cli_bad_data_flags_exit_2_with_one_line(args: list[str], needle: str, tmp_path: Path) -> None:
    r = stallscope("run", "imagenet", *args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2
    assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "run" / "run.sqlite").exists()


def test_cli_empty_data_directory_exits_2(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = stallscope("run", "imagenet", "--data", str(tmp_path / "empty"), "--no-live", "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "no class subdirectories" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_dali_on_a_scenario_without_image_files_exits_2(tmp_path: Path) -> None:
    r = stallscope("run", "fashion-vgg", "--pipeline", "dali", "--no-live", "--out", str(tmp_path / "r"))
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if "error" in ln]
    assert errors == [
        "stallscope: error: --pipeline: dali cannot train scenario 'fashion-vgg': needs an image-folder or detection "
        "dataset (a file-backed scenario); this one makes its data in memory; pipelines that can: naive, prefetch"
    ]
    assert r.stderr.splitlines() == errors  # one line: refused before any run (no banner, no run directory)
    assert not (tmp_path / "r").exists()
    assert "Traceback" not in r.stderr
