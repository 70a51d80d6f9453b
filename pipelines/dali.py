"""The ``dali`` pipeline: NVIDIA DALI reads, decodes and augments an image folder in native threads.

Graph: ``fn.readers.file`` over the scanned file list (``ImageFolderSource.files``, never ``file_root``: the
scan already left bad files out) -> ``fn.decoders.image`` (``"mixed"`` on CUDA: nvJPEG on the GPU, the
decoded batch never visits host memory; ``"cpu"`` otherwise: libjpeg-turbo) -> the ``AugmentSpec``
realised with DALI operators -> ``fn.crop_mirror_normalize`` to float32 CHW. ``DALIGenericIterator`` hands
over torch tensors; ``DaliBatches`` turns them into ``(x, y)`` with int64 labels, one epoch per ``iter()``.

How the spec maps (and what differs from ``torchvision_transform``, which naive/prefetch run):

- Decode: the CPU decoder gives the same pixels as PIL (both libjpeg-turbo: measured bit-identical on every
  test file). The mixed decoder is not expected to (nvJPEG's IDCT and chroma upsampling; unmeasured here).
  EXIF orientation is ignored (``adjust_orientation=False``) because PIL's ``Image.open`` ignores it too.
- Center crop: the shorter side is resized to ``resize_shorter`` with the long side truncated as torchvision
  computes it, and the crop window is placed with torchvision's anchor (round half to even, zero padding
  when the image is smaller than the crop), both computed per sample from the decoded shape. With
  ``resize=0`` the CPU output therefore equals naive's up to float rounding of the normalisation.
- Resampling: ``INTERP_LINEAR`` with ``antialias=True`` (DALI's default; a triangle filter widened by the
  downscale factor), which is what PIL's antialiased BILINEAR also is. DALI filters in float and rounds
  once; PIL uses 8-bit fixed-point coefficients and rounds per pass: measured at most 1 grey level apart for
  resize 256 + crop 224. At the edge of an image smaller than the crop they differ more (PIL renormalises
  the filter over in-image taps, DALI repeats the edge pixel).
- Random-resized crop: DALI's own sampler (same area/aspect-ratio ranges, 10 attempts, center fallback):
  the same distribution as torchvision's, not the same draws.
- Flip is fused into ``crop_mirror_normalize`` and so runs after the affine; the affine's parameters are
  mirror-symmetric, so the distribution of outputs is unchanged.
- Affine: rotation, scale and translation about the image center, nearest-neighbour with fill 0 as
  torchvision's ``RandomAffine`` defaults; translation is continuous where torchvision rounds to pixels.
- Grayscale: decoded as GRAY (the JPEG's own luma, no chroma decoding: cheaper) where torchvision decodes
  RGB, clamps it to 0-255 and converts with PIL's L formula. Measured: 0.1 grey level apart on average on
  ordinary images, but up to tens of levels where strongly saturated colours clamp in RGB.

Shuffling: ``shuffle_after_epoch`` (a full permutation per epoch seeded by ``spec.seed``), not
``random_shuffle``, which only shuffles within a 1,024-sample buffer: on the scan's class-sorted list that
would give near single-class batches on any real data set. ``pad_last_batch=True`` makes every epoch start
at its first sample (without it the reader runs on into the next epoch and epochs stop being permutations).

Bad samples: ``skips`` lists the files the scan left out. A file that passes the scan but fails inside DALI
cannot be skipped under ``--on-bad-sample skip``: DALI has no way to drop a sample from a batch in flight
and the pipeline is dead after a decode error. DALI 2.x's decoder error does not name the file
(``nvImageCodec failure: '#3'``), so ``DaliBatches`` looks for it: the files of the current epoch not yet
delivered first, then the rest, fully decoded with PIL within ``DIAGNOSE_BUDGET_S``; found, it raises
``BadSampleError("bad sample '<path>': ...")``, else a ``RuntimeError`` saying what happened. A file
that vanishes after the scan is named by the reader's own message and becomes a ``BadSampleError`` too.
naive/prefetch, by contrast, also skip decode-time failures. Any other operator error is a
``DaliPipelineError``; the loader's ``worker_failure`` words it for the run's error (DALI's threads, this
process's pid, the operator DALI names).

Invariants: DALI is imported only inside this module's functions (listing pipelines must not need it);
every ``PipelineError`` message is one line; ``config`` states the knobs actually passed to DALI.
"""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

from pipelines import PipelineError
from pipelines.augment import AugmentSpec
from pipelines.base import BuiltLoader, LoaderSpec, pinned_device
from pipelines.imagefolder import BadSampleError, ImageFolderSource, SkipLog, one_line
from pipelines.naive import move

READER = "Reader"
PREFETCH_QUEUE_DEPTH = 2
# How long a failed run may spend finding the file DALI could not decode. PIL fully decodes a 400x350 JPEG
# in 2-4 ms on one core, so this covers about 10k files, and a run on ImageNet still ends promptly.
DIAGNOSE_BUDGET_S = 30.0
INSTALL_HINT = "pip install nvidia-dali-cuda130, or `make` set-up installs it; or use --pipeline naive|prefetch"


def import_dali() -> Any:
    """The ``nvidia.dali`` package with the submodules this pipeline uses, or a one-line ``PipelineError``."""
    try:
        # submodules are imported for their side effect: they become attributes of the returned package
        import nvidia.dali.fn
        import nvidia.dali.math
        import nvidia.dali.plugin.pytorch
        import nvidia.dali.types  # noqa: F401
        from nvidia import dali
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError from a CUDA library the wheel could not load
        raise PipelineError(
            f"NVIDIA DALI is not installed (import nvidia.dali failed: {one_line(exc)}): {INSTALL_HINT}"
        ) from None
    return dali


def unusable(data: str | None) -> str | None:
    """Why this pipeline cannot train a scenario whose ``Scenario.data`` is ``data`` here (one line), or None.

    DALI reads files: a scenario that makes its data in memory has none for it. Judged from the declaration
    alone; a file-backed scenario whose dataset is not an image folder or a detection set is found out at
    build time (:func:`_image_folder`).
    """
    if data is None:
        return "needs an image-folder or detection dataset (a file-backed scenario); this one makes its data in memory"
    try:
        import_dali()
    except PipelineError as exc:
        return str(exc)
    return None


def _image_folder(dataset: Any) -> tuple[ImageFolderSource, AugmentSpec]:
    source = getattr(dataset, "source", None)
    augment = getattr(dataset, "augment", None)
    if not isinstance(source, ImageFolderSource) or not isinstance(augment, AugmentSpec):
        raise PipelineError(
            "the dali pipeline needs an image-folder dataset (ImageFolderDataset with .source and .augment); "
            f"scenario dataset {type(dataset).__name__} is not one: use --pipeline naive or prefetch"
        )
    return source, augment


def _center_anchor(dmath: Any, extent: Any, crop: int) -> Any:
    """torchvision's center-crop start along one axis, as a DALI expression of the (per-sample) extent.

    ``round((extent - crop) / 2)`` with Python's round-half-to-even when the image is larger, and
    ``-((crop - extent) // 2)`` (the left/top zero padding) when it is smaller. DALI has no modulo and
    its ``round`` goes half away from zero, hence the integer arithmetic.
    """
    d = extent - crop
    e = dmath.abs(d)
    k = e // 2
    odd = e - 2 * k
    k_odd = k - 2 * (k // 2)
    return (k + odd * k_odd) * (d >= 0) - k * (d < 0)


def _crop_position(dmath: Any, types: Any, fn: Any, extent: Any, crop: int) -> Any:
    """The normalised ``crop_pos`` that makes DALI's ``round(pos * (extent - crop))`` land on the anchor."""
    d = extent - crop
    anchor = fn.cast(_center_anchor(dmath, extent, crop), dtype=types.FLOAT)
    return anchor / fn.cast(d + (d == 0), dtype=types.FLOAT)  # d == 0: any position; avoid 0/0


def _augment(dali: Any, images: Any, aug: AugmentSpec) -> Any:
    """The spec's crop, affine, flip and normalisation as DALI operators; float32 CHW out."""
    fn, types, dmath = dali.fn, dali.types, dali.math
    cmn: dict[str, Any] = {}
    if aug.crop == "random-resized":
        images = fn.random_resized_crop(
            images,
            size=[aug.size, aug.size],
            random_area=list(aug.scale),
            random_aspect_ratio=list(aug.ratio),
            interp_type=types.INTERP_LINEAR,
            antialias=True,
        )
    else:
        shape = images.shape()
        h, w = shape[0], shape[1]
        if aug.resize_shorter:
            # torchvision: the shorter side becomes R, the longer int(R * long / short); integer floor division
            # gives the same value exactly (float32 division could land a hair below an integer)
            r = aug.resize_shorter
            portrait = w <= h
            new_w = r * portrait + (r * w // h) * (w > h)
            new_h = r * (w > h) + (r * h // w) * portrait
            images = fn.resize(
                images,
                resize_x=fn.cast(new_w, dtype=types.FLOAT),
                resize_y=fn.cast(new_h, dtype=types.FLOAT),
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            h, w = new_h, new_w
        cmn = {
            "crop": (aug.size, aug.size),
            "crop_pos_x": _crop_position(dmath, types, fn, w, aug.size),
            "crop_pos_y": _crop_position(dmath, types, fn, h, aug.size),
            "out_of_bounds_policy": "pad",
            # fill_values are output (normalised) values: -mean/std is the black pixel torchvision pads with
            "fill_values": [-m / s for m, s in zip(aug.mean, aug.std, strict=True)],
        }
    if aug.affine is not None:
        a = aug.affine
        center = [aug.size / 2, aug.size / 2]
        shift = a.translate * aug.size
        matrix = fn.transforms.scale(scale=fn.random.uniform(range=list(a.scale)), ndim=2, center=center)
        matrix = fn.transforms.rotation(matrix, angle=fn.random.uniform(range=[-a.degrees, a.degrees]), center=center)
        matrix = fn.transforms.translation(matrix, offset=fn.random.uniform(range=[-shift, shift], shape=[2]))
        images = fn.warp_affine(images, matrix=matrix, inverse_map=False, fill_value=0.0, interp_type=types.INTERP_NN)
    if aug.flip_p:
        cmn["mirror"] = fn.random.coin_flip(probability=aug.flip_p)
    return fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        output_layout="CHW",
        mean=[m * 255 for m in aug.mean],
        std=[s * 255 for s in aug.std],
        **cmn,
    )


def new_pipe(dali: Any, spec: LoaderSpec, cuda: int | None) -> Any:
    """An empty ``dali.Pipeline`` with the spec's batch size, threads and seed, for a graph to be defined in."""
    return dali.Pipeline(
        batch_size=spec.batch_size,
        num_threads=max(1, spec.workers),
        device_id=cuda,  # None: a CPU-only pipeline (no CUDA context is created)
        prefetch_queue_depth=PREFETCH_QUEUE_DEPTH,
        seed=spec.seed,
    )


def reader_options(spec: LoaderSpec) -> dict[str, Any]:
    """The reader arguments every graph passes: epochs that are full permutations and start at their first
    sample (see the module docstring), and the name the iterator finds the reader by."""
    shuffle: dict[str, Any] = (
        {"shuffle_after_epoch": True, "shuffle_after_epoch_seed": spec.seed} if spec.shuffle else {}
    )
    shard = {"shard_id": spec.shard, "num_shards": spec.num_shards} if spec.num_shards > 1 else {}
    return {"pad_last_batch": True, "seed": spec.seed, "name": READER, **shuffle, **shard}


def _build_pipe(
    dali: Any, source: ImageFolderSource, aug: AugmentSpec, spec: LoaderSpec, cuda: int | None, *, upto: str = "augment"
) -> Any:
    """The graph, or its prefix up to and with ``upto`` (one of :data:`STAGES`: the reader alone, the reader and the
    decoder, the whole graph) for :func:`time_stages`."""
    fn, types = dali.fn, dali.types
    pipe = new_pipe(dali, spec, cuda)
    with pipe:
        # the reader's "labels" are sample indices: DaliBatches maps them to class labels and, when a decode
        # fails, knows which files of the epoch were already delivered (and so are not the culprit)
        encoded, index = fn.readers.file(
            files=list(source.files), labels=list(range(len(source.files))), **reader_options(spec)
        )
        if upto == "fetch":
            pipe.set_outputs(encoded, index)
            return pipe
        images = fn.decoders.image(
            encoded,
            device="cpu" if cuda is None else "mixed",
            output_type=types.GRAY if aug.grayscale else types.RGB,
            adjust_orientation=False,
        )
        pipe.set_outputs(_augment(dali, images, aug) if upto == "augment" else images, index)
    return pipe


STAGES = ("fetch", "decode", "augment")  # the graph's prefixes: reader; + decoder; + augmentation (the whole)
STAGE_ROUNDS = 7  # rounds of the three prefixes in turn: a burst on a shared host falls on all three alike
# batches of each prefix a round: at 2 (16 samples, ~20 ms) one scheduling event decided a round (likely: threads
# woken for it still had the scheduler's credit for their sleep), and beside two busy processes the capacity read
# up to x2.15 the rate the same graph kept up in training; at 8, x0.86-x1.24 (x1.04-x1.09 quiet)
STAGE_BATCHES = 8


def warm_up(pipe: Any) -> None:
    """Build ``pipe`` and run its first batches, leaving nothing in flight: a fresh pipeline's first
    ``schedule_run()`` queues the whole prefetch depth at once."""
    pipe.schedule_run()
    for _ in range(PREFETCH_QUEUE_DEPTH):
        pipe.outputs()


def drained_round(pipe: Any, batches: int) -> None:
    """Exactly ``batches`` iterations of a warmed ``pipe`` with nothing in flight, queued ``PREFETCH_QUEUE_DEPTH``
    ahead as ``run()`` keeps them, and all collected before returning, so that a clock around the call holds their
    work and no other: batches left queued would be computed behind it (docs/metrics.md, DALI's stages)."""
    ahead = min(PREFETCH_QUEUE_DEPTH, batches)
    for _ in range(ahead):
        pipe.schedule_run()
    for k in range(batches):
        pipe.outputs()
        if k + ahead < batches:
            pipe.schedule_run()


def time_stages(
    dataset: Any,
    spec: LoaderSpec,
    rounds: int = STAGE_ROUNDS,
    batches: int = STAGE_BATCHES,
    waited: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Seconds per sample of each prefix of the image-folder graph, each run alone (no training)
    with the spec's threads: the reader; the reader and the decoder; the whole graph, in ``rounds`` rounds of
    ``batches`` batches each, the three in turn; the median round of each. DALI gives no per-operator times (its
    executor statistics are memory sizes), so a stage's time is what adding it costs a sample: the difference of
    two prefixes. MEASURED prefixes; the stages DERIVED from them. ``waited``: the calling thread's run-queue wait
    so far (s, schedstat); each round's is taken out of its time (the thread that calls the graph is not the
    graph)."""
    import statistics
    import time

    caller_waited = waited or (lambda: 0.0)
    try:
        source, aug = _image_folder(dataset)
    except PipelineError:
        return {"not_timed": f"{type(dataset).__name__} is not an image-folder data set: only that graph is timed"}
    dali = import_dali()
    device = pinned_device(spec.device)
    cuda = device.index if device.type == "cuda" else None
    pipes = {upto: _build_pipe(dali, source, aug, spec, cuda, upto=upto) for upto in STAGES}
    spent: dict[str, list[float]] = {upto: [] for upto in STAGES}
    try:
        for pipe in pipes.values():
            warm_up(pipe)
        for _ in range(rounds):
            for upto, pipe in pipes.items():
                t0, w0 = time.perf_counter(), caller_waited()
                drained_round(pipe, batches)
                own = time.perf_counter() - t0 - (caller_waited() - w0)
                spent[upto].append(max(0.0, own) / (batches * spec.batch_size))
    finally:
        pipes.clear()
    return {
        "prefix_s_per_sample": {upto: statistics.median(xs) for upto, xs in spent.items()},
        "rounds": rounds,
        "batches": batches,
        "batch_size": spec.batch_size,
        "threads": max(1, spec.workers),
        "decoder": "cpu" if cuda is None else "mixed",
        "caller_runq_out": waited is not None,
    }


def _dali_reason(message: str) -> str:
    """The operator's own error from a DALI "Critical error in pipeline" message, on one line (without the
    Python frames DALI lists after "At:")."""
    lines = [ln.strip() for ln in message.splitlines()]
    if "encountered:" in lines:
        rest = [ln for ln in lines[lines.index("encountered:") + 1 :] if ln]
        if "At:" in rest:
            rest = rest[: rest.index("At:")]
        keep = [ln for ln in rest if not ln.startswith(("C++ context", "Current pipeline object"))]
        if keep:
            return " ".join(keep[:2])
    useful = [ln for ln in lines if ln and not ln.startswith(("Critical error", "Current pipeline object"))]
    return useful[-1] if useful else "unknown DALI error"


def _dali_operator(message: str) -> str | None:
    """The operator a DALI error names ("Error in CPU operator `nvidia.dali.fn.python_function`"), short."""
    found = re.search(r"Error in (\w+) operator `([^`]+)`", message)
    return f"{found.group(2).removeprefix('nvidia.dali.')} ({found.group(1)})" if found else None


class DaliPipelineError(RuntimeError):
    """An operator failed inside DALI's threads (not a file the decoder or reader named: that is a
    ``BadSampleError``); the pipeline is dead. ``operator`` is the one DALI names, when it does."""

    def __init__(self, reason: str, operator: str | None) -> None:
        super().__init__(f"DALI pipeline failed: {reason}")
        self.reason = reason
        self.operator = operator


def _pil_failure(path: str) -> str | None:
    """Why PIL cannot fully decode ``path`` (None when it can)."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.load()
    except Exception as exc:  # noqa: BLE001 - any decoder complaint is the answer we are looking for
        return one_line(exc)
    return None


class DaliEpochs:
    """A DALI iterator as training batches, one epoch per ``iter()``.

    An epoch abandoned part-way is drained at the next ``iter()`` (DALI cannot reset mid-epoch), so every
    pass starts at an epoch boundary. After a pipeline error the object is dead: later passes re-raise.
    Subclasses say how a DALI output becomes a batch (``_convert``) and may widen how an error names its file
    (``_named``); the epoch, drain and error handling live here once.
    """

    def __init__(self, pipe: Any, iterator: Any, source: Any, batches_per_epoch: int) -> None:
        self._pipe = pipe
        self._it = iterator
        self._source = source  # an ImageFolderSource or CocoDetectionSource: .files and .on_bad_sample
        self._delivered = torch.zeros(len(source.files), dtype=torch.bool)  # this epoch, when _convert knows
        self._len = batches_per_epoch
        self._mid_epoch = False
        self._error: Exception | None = None

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[Any]:
        if self._error is not None:
            raise self._error
        if self._it is None:
            raise RuntimeError("the dali loader was closed")
        if self._mid_epoch:
            for _ in self._next_batches():
                pass
        return self._next_batches()

    def _next_batches(self) -> Iterator[Any]:
        self._delivered.zero_()
        self._mid_epoch = True
        while True:
            try:
                out = next(self._it)
            except StopIteration:
                self._mid_epoch = False
                return
            except RuntimeError as exc:
                self._error = self._explain(exc)
                raise self._error from None
            yield self._convert(out[0])

    def _convert(self, out: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _named(self, message: str) -> str | None:
        """The file DALI's error message names, if any (full paths: class folders may reuse file names)."""
        return next((path for path in self._source.files if path in message), None)

    def _explain(self, exc: RuntimeError) -> Exception:
        """DALI's error as the policy's error: a ``BadSampleError`` naming the file when it can be found."""
        message = str(exc)
        if "Critical error in pipeline" not in message:
            return exc
        reason = _dali_reason(message)
        files = self._source.files
        named = self._named(message)
        if named is not None:
            return BadSampleError(f"bad sample {named!r}: {reason}{self._skip_note()}")
        if "decoders.image" not in message:
            return DaliPipelineError(reason, _dali_operator(message))
        # The decoder does not say which file: check the likeliest ones first (not yet delivered this
        # epoch), then the rest, since prefetching may already have reached the next epoch.
        deadline = time.monotonic() + DIAGNOSE_BUDGET_S
        delivered = self._delivered.tolist()
        order = [i for i, done in enumerate(delivered) if not done] + [i for i, done in enumerate(delivered) if done]
        checked = 0
        for i in order:
            if time.monotonic() > deadline:
                break
            checked += 1
            why = _pil_failure(files[i])
            if why is not None:
                return BadSampleError(
                    f"bad sample {files[i]!r}: DALI could not decode it ({reason}; PIL: {why}){self._skip_note()}"
                )
        return RuntimeError(
            f"DALI could not decode an image that passed the scan ({reason}) and does not say which; "
            f"PIL decodes all {checked} of {len(files)} files checked in {DIAGNOSE_BUDGET_S:g} s: "
            "run with --pipeline naive to have the file named"
        )

    def worker_failure(self, exc: BaseException) -> str | None:
        """The ``BuiltLoader.worker_failure`` of a DALI loader: DALI's worker threads run in this process."""
        if not isinstance(exc, DaliPipelineError):
            return None
        where = f" in operator {exc.operator}" if exc.operator else ""
        return f"DALI's worker threads (in this process, pid {os.getpid()}) stopped{where}: {exc.reason}"

    def _skip_note(self) -> str:
        if self._source.on_bad_sample == "skip":
            return " (the dali pipeline cannot skip a file that fails mid-run: remove it, or use --pipeline naive)"
        return ""

    def close(self) -> None:
        """Stop DALI's threads now rather than at garbage collection; idempotent."""
        self._it = None
        pipe, self._pipe = self._pipe, None
        shutdown = getattr(pipe, "_shutdown", None)  # what Pipeline.__del__ calls; no public equivalent
        if callable(shutdown):
            shutdown()


class DaliBatches(DaliEpochs):
    """Classification: ``(x, y)`` batches, float32 NCHW and int64 ``[N]`` class labels."""

    def __init__(self, pipe: Any, iterator: Any, source: ImageFolderSource, batches_per_epoch: int) -> None:
        super().__init__(pipe, iterator, source, batches_per_epoch)
        self._labels = torch.tensor(source.labels, dtype=torch.int64)

    def _convert(self, out: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        # the reader's "labels" are sample indices (see the pipeline): map them to class labels
        index = out["label"].reshape(-1).to(torch.int64)
        self._delivered[index] = True
        return out["data"], self._labels[index]


def build_loader(
    dataset: Any,
    spec: LoaderSpec,
    source: Any,
    *,
    graph: Callable[[Any, int | None], Any],
    outputs: Sequence[str],
    batches: Callable[[Any, Any, int], DaliEpochs],
    config: dict[str, Any] | None = None,
) -> BuiltLoader:
    """The steps every DALI loader shares, around the task's own parts.

    ``graph(dali, cuda)`` builds the pipeline (``cuda``: the device id, None on CPU) whose reader is named
    ``READER`` and whose outputs are ``outputs``; ``batches(pipe, iterator, batches_per_epoch)`` wraps it;
    ``config`` adds the task's own keys to the shared ones; ``source.files`` is the epoch's file list.
    """
    dali = import_dali()
    device = pinned_device(spec.device)
    cuda = device.index if device.type == "cuda" else None
    pipe = graph(dali, cuda)
    plugin = dali.plugin.pytorch
    iterator = plugin.DALIGenericIterator(
        pipe,
        list(outputs),
        reader_name=READER,
        last_batch_policy=plugin.LastBatchPolicy.DROP if spec.drop_last else plugin.LastBatchPolicy.PARTIAL,
        auto_reset=True,
        # the first batch is decoded on the first next(), inside Session.wrap, as a DataLoader's is
        prepare_first_batch=False,
    )
    n = len(source.files)
    per_epoch = n // spec.batch_size if spec.drop_last else math.ceil(n / spec.batch_size)
    epochs = batches(pipe, iterator, per_epoch)
    return BuiltLoader(
        batches=epochs,
        # mixed decoding already left the images on the GPU: only labels or targets travel; on CPU a no-op
        to_device=partial(move, device=device),
        config={
            "pipeline": "dali",
            **(config or {}),
            "workers": max(1, spec.workers),
            "workers_meaning": "DALI CPU threads (num_threads) in this process, not DataLoader worker processes",
            "worker_processes": 0,
            "pin_memory": None,
            "decoder": "cpu" if cuda is None else "mixed",
            "prefetch_queue_depth": PREFETCH_QUEUE_DEPTH,
            "shuffle": "full permutation per epoch (shuffle_after_epoch)" if spec.shuffle else False,
            **({"shard": f"{spec.shard} of {spec.num_shards} (reader shard_id)"} if spec.num_shards > 1 else {}),
            "dali": str(dali.__version__),
        },
        skips=SkipLog.for_dataset(dataset),
        worker_failure=epochs.worker_failure,
    )


def build_classification(dataset: Any, spec: LoaderSpec) -> BuiltLoader:
    """The loader for an image-folder dataset (``ImageFolderDataset``: ``.source`` and ``.augment``)."""
    source, aug = _image_folder(dataset)
    return build_loader(
        dataset,
        spec,
        source,
        graph=lambda dali, cuda: _build_pipe(dali, source, aug, spec, cuda),
        outputs=("data", "label"),
        batches=lambda pipe, iterator, per_epoch: DaliBatches(pipe, iterator, source, per_epoch),
    )
