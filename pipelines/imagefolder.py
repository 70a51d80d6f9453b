"""An image-folder source every pipeline can read, and the policy for bad files in it.

``ImageFolderSource.scan(root)`` lists ``root/<class>/<file>`` (labels by sorted class directory, as
torchvision's ImageFolder and DALI's readers.file assign them) and checks every file cheaply: a known image
signature at the start and, for JPEG and PNG, the end marker at the end (what a truncated download or a
half-written file lacks). With ``on_bad_sample="fail"`` the first bad file is a ``BadSampleError`` naming it,
before any training starts; with ``"skip"`` bad files are left out and listed in ``bad``.

``ImageFolderDataset`` is the map-style dataset ``naive`` and ``prefetch`` load with (PIL decode +
``torchvision_transform``); ``dali`` reads the same ``source`` (file list and labels) and ``augment``
instead. A file that passes the scan but still fails to decode is handled by the same policy at load time:
``fail`` raises ``BadSampleError``; ``skip`` drops it from its batch (``SkipCollate``) and the pipeline
records it (``SkipLog``), so the run's summary lists every skipped file whichever pipeline ran.

Invariants: ``files`` and ``labels`` are parallel, sorted by (class, name), and hold only files that passed
the scan; a ``BadSampleError`` message is one line that starts with "bad sample " and names the file.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import stages, store
from pipelines.augment import AugmentSpec, torchvision_transform

POLICIES = ("fail", "skip")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
_SIGNATURES = {
    b"\xff\xd8\xff": "jpeg",
    b"\x89PNG\r\n\x1a\n": "png",
    b"BM": "bmp",
    b"RIFF": "webp",
}
_TAIL = 64  # bytes read from the end to find the end marker (JPEG writers may pad after EOI)


class DataSourceError(ValueError):
    """The image folder itself is unusable (missing, not a directory, no images); one-line message."""


class BadSampleError(ValueError):
    """One file that cannot be used; the message is one line naming the file.

    Takes a single string so that a DataLoader worker can re-raise it in the main process.
    """


@dataclass(frozen=True, slots=True)
class BadSample:
    """A file left out under the skip policy, and why: listed in a source's ``bad`` and a ``SkipLog``, and
    also the placeholder a dataset item becomes when its file fails to decode (``SkipCollate`` drops it)."""

    path: str
    reason: str


def scan_root(root: Path | str, on_bad_sample: str) -> Path:
    """``root`` as a ``Path``, after the checks every scan starts with: a known policy and an existing directory."""
    if on_bad_sample not in POLICIES:
        raise ValueError(f"on_bad_sample {on_bad_sample!r} is not one of {', '.join(POLICIES)}")
    root = Path(root)
    if not root.exists():
        raise DataSourceError(f"data directory {str(root)!r} does not exist")
    if not root.is_dir():
        raise DataSourceError(f"data directory {str(root)!r} is not a directory")
    return root


def rejected(path: Path, reason: str, on_bad_sample: str) -> BadSample:
    """A file the scan found unusable: a ``BadSampleError`` under ``fail``, else the entry for ``bad``."""
    if on_bad_sample == "fail":
        raise BadSampleError(f"bad sample {str(path)!r}: {reason} (use --on-bad-sample skip to leave such files out)")
    return BadSample(str(path), reason)


def no_usable_image(root: Path, bad: int) -> DataSourceError:
    """The error for a scan that found ``bad`` bad files and no good one."""
    return DataSourceError(f"data directory {str(root)!r} holds no usable image ({bad} bad files)")


def one_line(exc: BaseException) -> str:
    """``exc``'s message on one line (its type name when it has none): how errors quote a library's error."""
    return " ".join(str(exc).split()) or type(exc).__name__


def check_file(path: Path) -> str | None:
    """Why ``path`` is not a usable image (None when it looks complete). Reads at most 128 bytes."""
    try:
        size = path.stat().st_size
        if size == 0:
            return "empty file"
        with path.open("rb") as fh:
            head = fh.read(12)
            fh.seek(max(0, size - _TAIL))
            tail = fh.read(_TAIL)
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    kind = next((k for sig, k in _SIGNATURES.items() if head.startswith(sig)), None)
    if kind is None:
        return "not an image (no JPEG/PNG/BMP/WebP signature)"
    if kind == "jpeg" and b"\xff\xd9" not in tail:
        return "truncated JPEG (no end-of-image marker)"
    if kind == "png" and b"IEND" not in tail:
        return "truncated PNG (no IEND chunk)"
    return None


@dataclass(frozen=True, slots=True)
class ImageFolderSource:
    root: Path
    classes: tuple[str, ...]
    files: tuple[str, ...]
    labels: tuple[int, ...]
    on_bad_sample: str = "fail"
    bad: tuple[BadSample, ...] = ()

    @classmethod
    def scan(cls, root: Path | str, on_bad_sample: str = "fail") -> ImageFolderSource:
        root = scan_root(root, on_bad_sample)
        classes = tuple(sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")))
        if not classes:
            raise DataSourceError(
                f"data directory {str(root)!r} has no class subdirectories: expected ROOT/<class>/<image> "
                "(make one with `stallscope data make imagenet-like --out DIR --count N`)"
            )
        files: list[str] = []
        labels: list[int] = []
        bad: list[BadSample] = []
        for label, name in enumerate(classes):
            for entry in sorted(os.scandir(root / name), key=lambda e: e.name):
                if entry.name.startswith(".") or not entry.is_file():
                    continue
                path = Path(entry.path)
                reason = (
                    check_file(path)
                    if path.suffix.lower() in IMAGE_EXTENSIONS
                    else f"not an image (extension {path.suffix or 'none'!r})"
                )
                if reason is None:
                    files.append(str(path))
                    labels.append(label)
                else:
                    bad.append(rejected(path, reason, on_bad_sample))
        if not files:
            raise no_usable_image(root, len(bad))
        return cls(root, classes, tuple(files), tuple(labels), on_bad_sample, tuple(bad))

    def subset(self, count: int) -> ImageFolderSource:
        """The first ``count`` files of every class in turn (a balanced, deterministic subset)."""
        if count >= len(self.files):
            return self
        by_class: dict[int, list[int]] = {}
        for i, label in enumerate(self.labels):
            by_class.setdefault(label, []).append(i)
        picked: list[int] = []
        rank = 0
        while len(picked) < count:
            for idx in by_class.values():
                if rank < len(idx) and len(picked) < count:
                    picked.append(idx[rank])
            rank += 1
        picked.sort()
        return ImageFolderSource(
            self.root,
            self.classes,
            tuple(self.files[i] for i in picked),
            tuple(self.labels[i] for i in picked),
            self.on_bad_sample,
            self.bad,
        )


class ImageFolderDataset:
    """Map-style dataset over an ``ImageFolderSource``: PIL decode + the spec's torchvision realisation.

    Items are ``(float32 [C, size, size], int64 label)``, or a ``BadSample`` under the skip policy.
    """

    def __init__(self, source: ImageFolderSource, augment: AugmentSpec) -> None:
        self.source = source
        self.augment = augment
        self.transform = torchvision_transform(augment)

    @classmethod
    def from_dir(cls, root: Path | str, augment: AugmentSpec, on_bad_sample: str = "fail") -> ImageFolderDataset:
        return cls(ImageFolderSource.scan(root, on_bad_sample), augment)

    def __len__(self) -> int:
        return len(self.source.files)

    def __getitem__(self, index: int) -> Any:
        import torch

        rgb = load_rgb(self.source.files[index], self.source.on_bad_sample)
        if isinstance(rgb, BadSample):
            return rgb
        with stages.timed("augment"):
            x = self.transform(rgb)
        return x, torch.tensor(self.source.labels[index], dtype=torch.int64)


def load_rgb(path: str, on_bad_sample: str) -> Any:
    """The file read (the ``fetch`` stage, paced by :mod:`pipelines.store` when installed), then decoded by PIL as
    RGB (``decode``); a file that cannot be read or decoded is a ``BadSample`` (skip policy) or ``BadSampleError``."""
    with stages.timed("fetch"):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            return _bad(path, one_line(exc), on_bad_sample)
        store.pace(len(data))  # an emulated store (run --store-mbps), when one is installed
    with stages.timed("decode"):
        return decode_rgb(path, data, on_bad_sample)


def decode_rgb(path: str, data: bytes, on_bad_sample: str) -> Any:
    """``data`` (the bytes of ``path``) decoded by PIL as RGB; a failure is a ``BadSample`` or ``BadSampleError``."""
    from PIL import Image, UnidentifiedImageError

    stream = io.BytesIO(data)
    try:
        with Image.open(stream) as img:
            return img.convert("RGB")
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as exc:
        # PIL names the stream it was given ("cannot identify image file <_io.BytesIO ...>"): name the file
        return _bad(path, one_line(exc).replace(repr(stream), repr(path)), on_bad_sample)


def _bad(path: str, reason: str, on_bad_sample: str) -> BadSample:
    if on_bad_sample == "skip":
        return BadSample(path, reason)
    raise BadSampleError(f"bad sample {path!r}: {reason}") from None


class SkipCollate:
    """Default collate over the items that are not ``BadSample``; returns ``(x, y, skipped)``.

    ``x``/``y`` are None when every item of the batch was skipped. A class (not a closure) so it pickles
    to DataLoader workers.
    """

    def __init__(self, collate: Callable[[list[Any]], Any] | None = None) -> None:
        self.collate = collate  # the dataset's own collate (detection), else torch's default

    def __call__(self, items: list[Any]) -> tuple[Any, Any, list[BadSample]]:
        from torch.utils.data import default_collate

        skipped = [it for it in items if isinstance(it, BadSample)]
        good = [it for it in items if not isinstance(it, BadSample)]
        if not good:
            return None, None, skipped
        x, y = (self.collate or default_collate)(good)
        return x, y, skipped


@dataclass(slots=True)
class SkipLog:
    """Main-process record of skipped files: scan-time ones first, then load-time ones as batches arrive."""

    policy: str = "fail"
    skipped: list[BadSample] = field(default_factory=list)

    @classmethod
    def for_dataset(cls, dataset: Any) -> SkipLog | None:
        # any file-backed source with a policy and a scan's bad list (image folders, COCO detection sets)
        source = getattr(dataset, "source", None)
        policy, bad = getattr(source, "on_bad_sample", None), getattr(source, "bad", None)
        if policy not in POLICIES or not isinstance(bad, tuple):
            return None
        return cls(policy, list(bad))

    def strip(self, batches: Any) -> Iterator[tuple[Any, Any]]:
        """Yield ``(x, y)`` from ``(x, y, skipped)`` batches, recording the skipped files."""
        for x, y, skipped in batches:
            self.skipped.extend(skipped)
            if x is not None:
                yield x, y

    def wrap(self, loader: Any) -> StrippedBatches:
        return StrippedBatches(loader, self)

    def to_meta(self, limit: int = 50) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "skipped": len(self.skipped),
            "files": [{"path": b.path, "reason": b.reason} for b in self.skipped[:limit]],
        }


class StrippedBatches:
    """A re-iterable view of a ``SkipCollate`` loader yielding ``(x, y)``; one pass per ``iter()`` (epoch)."""

    def __init__(self, loader: Any, log: SkipLog) -> None:
        self.loader = loader
        self.log = log

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        return self.log.strip(self.loader)

    def __len__(self) -> int:
        return len(self.loader)
