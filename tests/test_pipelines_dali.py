"""The ``dali`` pipeline on a tiny generated image folder (CPU decoding; the mixed decoder needs a GPU).

Tests that need DALI skip when it is not installed; the error-message tests do not need it.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

import pipelines
from pipelines import LoaderSpec, PipelineError
from pipelines.augment import Affine, AugmentSpec
from pipelines.imagefolder import BadSampleError, ImageFolderDataset
from scenarios.fashion_vgg import SyntheticFashion

ROOT = Path(__file__).resolve().parents[1]
CLASSES = 3
COUNT = 24
SMALL = AugmentSpec(size=48)  # random-resized-crop + flip: small output keeps the tests quick


def write_image_folder(root: Path, count: int = COUNT, seed: int = 0) -> Path:
    """``count`` JPEGs in ``CLASSES`` class directories, 160-400 px a side: gradients plus filled shapes."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        label = i % CLASSES
        w, h = (int(v) for v in rng.integers(160, 401, 2))
        y, x = np.mgrid[0:h, 0:w]
        pixels = np.stack([x * 255 // w, y * 255 // h, ((x + y) * 127 // (w + h) + 60 * label) % 256], -1)
        img = Image.fromarray(pixels.astype(np.uint8))
        draw = ImageDraw.Draw(img)
        for _ in range(4):
            x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
            box = [x0, y0, x0 + int(rng.integers(10, 90)), y0 + int(rng.integers(10, 90))]
            draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        img.save(folder / f"{i:03d}.jpg", quality=90)
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_image_folder(tmp_path_factory.mktemp("images"))


@pytest.fixture
def dali() -> None:
    pytest.importorskip("nvidia.dali")


def _build(
    dataset: ImageFolderDataset,
    *,
    batch_size: int = 8,
    workers: int = 0,
    device: str = "cpu",
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = True,
) -> pipelines.BuiltLoader:
    spec = LoaderSpec(batch_size, workers, device, shuffle, seed, drop_last)
    return pipelines.get("dali").build(dataset, spec)


def _labels(built: pipelines.BuiltLoader) -> list[int]:
    return [int(v) for _, y in built.batches for v in y]


def test_registered_and_listing_imports_no_dali() -> None:
    code = (
        "import sys, pipelines; names = pipelines.names(); pipelines.get('dali'); "
        "assert 'dali' in names, names; assert 'nvidia.dali' not in sys.modules, 'DALI imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_a_dataset_that_is_not_an_image_folder_is_refused() -> None:
    with pytest.raises(PipelineError) as info:
        pipelines.get("dali").build(SyntheticFashion(length=8, augment=False), LoaderSpec(batch_size=4))
    message = str(info.value)
    assert message == (
        "the dali pipeline needs an image-folder dataset (ImageFolderDataset with .source and .augment); "
        "scenario dataset SyntheticFashion is not one: use --pipeline naive or prefetch"
    )


def test_missing_dali_is_a_one_line_pipeline_error(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a None entry makes `import nvidia.dali...` fail; every loaded submodule needs one too, and the parent
    # package must lose its attribute, or an earlier test's import of DALI still satisfies the import
    for name in [m for m in sys.modules if m == "nvidia.dali" or m.startswith("nvidia.dali.")] or ["nvidia.dali"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    if "nvidia" in sys.modules:
        monkeypatch.delattr(sys.modules["nvidia"], "dali", raising=False)
    with pytest.raises(PipelineError) as info:
        _build(ImageFolderDataset.from_dir(folder, SMALL))
    message = str(info.value)
    assert message.startswith("NVIDIA DALI is not installed (import nvidia.dali failed: ")
    assert "pip install nvidia-dali-cuda130" in message and "--pipeline naive|prefetch" in message
    assert "\n" not in message


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_shapes_labels_and_config(dali: None, folder: Path, workers: int) -> None:
    dataset = ImageFolderDataset.from_dir(folder, SMALL)
    built = _build(dataset, workers=workers, seed=1)
    try:
        batches = [built.to_device(batch) for batch in built.batches]
    finally:
        built.close()
    assert len(batches) == COUNT // 8 == len(built.batches)  # type: ignore[arg-type]
    for x, y in batches:
        assert x.shape == (8, 3, 48, 48) and x.dtype == torch.float32 and x.device.type == "cpu"
        assert y.shape == (8,) and y.dtype == torch.int64
    got = Counter(int(v) for _, y in batches for v in y)
    assert got == Counter(dataset.source.labels)  # every file once; labels are the class indices
    config = dict(built.config)
    assert config.pop("dali").startswith("2.")
    assert config == {
        "pipeline": "dali",
        "workers": max(1, workers),
        "workers_meaning": "DALI CPU threads (num_threads) in this process, not DataLoader worker processes",
        "worker_processes": 0,
        "pin_memory": None,
        "decoder": "cpu",
        "prefetch_queue_depth": 2,
        "shuffle": "full permutation per epoch (shuffle_after_epoch)",
    }


def test_every_epoch_is_a_fresh_full_permutation(dali: None, folder: Path) -> None:
    dataset = ImageFolderDataset.from_dir(folder, SMALL)
    built = _build(dataset, batch_size=5, drop_last=False, seed=3)
    try:
        epochs = [_labels(built) for _ in range(3)]
    finally:
        built.close()
    for labels in epochs:
        assert Counter(labels) == Counter(dataset.source.labels)
    assert len({tuple(e) for e in epochs}) > 1  # reshuffled between epochs


def test_shuffle_follows_the_seed_and_off_keeps_scan_order(dali: None, folder: Path) -> None:
    dataset = ImageFolderDataset.from_dir(folder, SMALL)

    def run(seed: int, shuffle: bool = True) -> tuple[list[int], torch.Tensor]:
        built = _build(dataset, seed=seed, shuffle=shuffle, workers=2)
        try:
            xs, ys = zip(*built.batches, strict=True)
        finally:
            built.close()
        return [int(v) for y in ys for v in y], torch.cat(xs)

    labels_a, pixels_a = run(5)
    labels_b, pixels_b = run(5)
    assert labels_a == labels_b and torch.equal(pixels_a, pixels_b)  # order, crops and flips all from the seed
    labels_c, pixels_c = run(6)
    assert labels_c != labels_a or not torch.equal(pixels_c, pixels_a)
    assert run(0, shuffle=False)[0] == list(dataset.source.labels)


def test_drop_last_false_keeps_the_remainder(dali: None, folder: Path) -> None:
    built = _build(ImageFolderDataset.from_dir(folder, SMALL), batch_size=10, drop_last=False)
    try:
        assert [len(y) for _, y in built.batches] == [10, 10, 4]
        assert [len(y) for _, y in built.batches] == [10, 10, 4]  # the next epoch starts at its beginning
        assert len(built.batches) == 3  # type: ignore[arg-type]
    finally:
        built.close()


def test_an_abandoned_epoch_does_not_shorten_the_next(dali: None, folder: Path) -> None:
    dataset = ImageFolderDataset.from_dir(folder, SMALL)
    built = _build(dataset, shuffle=False)
    try:
        first = iter(built.batches)
        next(first)
        del first  # the consumer breaks out after one batch
        assert _labels(built) == list(dataset.source.labels)
    finally:
        built.close()
    built.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        iter(built.batches)


def test_to_device_on_cpu_does_not_copy(dali: None, folder: Path) -> None:
    built = _build(ImageFolderDataset.from_dir(folder, SMALL))
    try:
        x, y = next(iter(built.batches))
        moved_x, moved_y = built.to_device((x, y))
        assert moved_x is x and moved_y is y
    finally:
        built.close()


def test_grayscale_with_affine(dali: None, folder: Path) -> None:
    aug = AugmentSpec(size=28, crop="center", resize=32, grayscale=True, mean=(0.5,), std=(0.5,), affine=Affine())
    built = _build(ImageFolderDataset.from_dir(folder, aug))
    try:
        batches = list(built.batches)
    finally:
        built.close()
    for x, y in batches:
        assert x.shape == (8, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
        assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0


def _copy_folder(src: Path, dst: Path) -> Path:
    for path in sorted(src.rglob("*.jpg")):
        target = dst / path.relative_to(src)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(path.read_bytes())
    return dst


def test_scanned_out_files_are_not_read_and_are_listed(dali: None, folder: Path, tmp_path: Path) -> None:
    root = _copy_folder(folder, tmp_path / "data")
    good = (root / "class_0" / "000.jpg").read_bytes()
    (root / "class_1" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (root / "class_2" / "notes.jpg").write_text("not a picture")
    dataset = ImageFolderDataset.from_dir(root, SMALL, on_bad_sample="skip")
    built = _build(dataset, drop_last=False)
    try:
        assert sum(len(y) for _, y in built.batches) == COUNT  # only the files that passed the scan
    finally:
        built.close()
    assert built.skips is not None
    meta = built.skips.to_meta()
    assert meta["policy"] == "skip" and meta["skipped"] == 2
    assert {Path(f["path"]).name for f in meta["files"]} == {"truncated.jpg", "notes.jpg"}


def _headers_only(jpeg: bytes) -> bytes:
    """A JPEG that passes the scan (SOI ... EOI) but has no image data: headers up to the scan, then EOI."""
    return jpeg[: jpeg.index(b"\xff\xda")] + b"\xff\xd9"


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_file_that_fails_to_decode_is_named(dali: None, folder: Path, tmp_path: Path, policy: str) -> None:
    root = _copy_folder(folder, tmp_path / "data")
    bad = root / "class_1" / "zz_no_scan.jpg"
    bad.write_bytes(_headers_only((root / "class_0" / "000.jpg").read_bytes()))
    dataset = ImageFolderDataset.from_dir(root, SMALL, on_bad_sample=policy)
    assert str(bad) in dataset.source.files  # the cheap scan cannot tell
    built = _build(dataset, seed=2)
    try:
        with pytest.raises(BadSampleError) as info:
            for _ in built.batches:
                pass
        message = str(info.value)
        assert message.startswith(f"bad sample {str(bad)!r}: DALI could not decode it (")
        assert "\n" not in message
        assert ("cannot skip" in message) == (policy == "skip")  # DALI cannot drop a sample mid-batch
        with pytest.raises(BadSampleError):  # the DALI pipeline is dead after a critical error
            iter(built.batches)
    finally:
        built.close()


def test_a_corrupt_body_decodes_as_pil_does(dali: None, folder: Path, tmp_path: Path) -> None:
    """Garbage entropy-coded data between valid headers and EOI: libjpeg warns and decodes garbage, in DALI
    and in PIL alike, so neither pipeline can call it bad."""
    root = _copy_folder(folder, tmp_path / "data")
    jpeg = bytearray((root / "class_0" / "000.jpg").read_bytes())
    start = jpeg.index(b"\xff\xda") + 20
    jpeg[start:-2] = bytes(0xFF if i % 2 else 0x00 for i in range(len(jpeg) - 2 - start))
    (root / "class_0" / "zz_garbage.jpg").write_bytes(bytes(jpeg))
    dataset = ImageFolderDataset.from_dir(root, SMALL)
    for name in ("dali", "naive"):
        built = pipelines.get(name).build(dataset, LoaderSpec(batch_size=5, drop_last=False))
        try:
            assert sum(len(y) for _, y in built.batches) == COUNT + 1
        finally:
            built.close()


def test_a_file_removed_after_the_scan_is_named(dali: None, folder: Path, tmp_path: Path) -> None:
    root = _copy_folder(folder, tmp_path / "data")
    dataset = ImageFolderDataset.from_dir(root, SMALL)
    gone = Path(dataset.source.files[-1])
    built = _build(dataset, shuffle=False)
    gone.unlink()
    try:
        with pytest.raises(BadSampleError, match=f"^bad sample {str(gone)!r}: File mapping failed"):
            for _ in built.batches:
                pass
    finally:
        built.close()


@pytest.mark.gpu
def test_mixed_decoding_leaves_the_batch_on_the_gpu(dali: None, folder: Path) -> None:
    built = _build(ImageFolderDataset.from_dir(folder, AugmentSpec(size=64)), device="cuda")
    try:
        assert built.config["decoder"] == "mixed"
        x, y = next(iter(built.batches))
        assert x.device.type == "cuda" and x.shape == (8, 3, 64, 64)  # decoded and augmented on the GPU
        moved_x, moved_y = built.to_device((x, y))
        assert moved_x is x and moved_y.device.type == "cuda"  # only the labels travel
    finally:
        built.close()


def test_a_timed_round_queues_as_run_does_and_leaves_nothing_in_flight(dali: None, folder: Path) -> None:
    """``time_stages`` runs its prefixes in turn: a round that left batches queued would have them computed behind
    its clock, beside the next prefix's round, and get them back done at its next one (DALI's capacity read up to
    x2.23 the loader's rate that way). A real pipeline: after a round, nothing is left to collect. A recording
    one: the round keeps the prefetch depth queued ahead, as ``run()`` does, and never waits on an empty queue."""
    from nvidia import dali as nd

    from pipelines.dali import PREFETCH_QUEUE_DEPTH, drained_round, new_pipe, warm_up

    pipe = new_pipe(nd, LoaderSpec(4, 2), None)
    with pipe:
        files = sorted(str(p) for p in folder.rglob("*.jpg"))
        encoded, _index = nd.fn.readers.file(files=files, labels=list(range(len(files))))
        pipe.set_outputs(encoded)
    warm_up(pipe)
    with pytest.raises(StopIteration):
        pipe.outputs()
    for batches in (8, 1):
        drained_round(pipe, batches)
        with pytest.raises(StopIteration):  # DALI's scheduled API: no batch left to consume
            pipe.outputs()

    class ThreadRecorder:
        def __init__(self) -> None:
            self.queued, self.most, self.collected = 0, 0, 0

        def schedule_run(self) -> None:
            self.queued += 1
            self.most = max(self.most, self.queued)

        def outputs(self) -> None:
            assert self.queued > 0, "waited on an empty queue"
            self.queued -= 1
            self.collected += 1

    fake = ThreadRecorder()
    drained_round(fake, 8)
    assert (fake.queued, fake.collected, fake.most) == (0, 8, PREFETCH_QUEUE_DEPTH)
