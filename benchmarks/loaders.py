"""Loader-only throughput of each pipeline beside the ceilings of this machine, measured in the same run.

What is measured (images/s, median of ``--repeats`` runs each; rounds interleave the variants so drift
spreads over all of them):

- ceiling "decode": the fastest JPEG decoder here (PIL, torchvision.io.decode_jpeg; DALI's CPU decoder is
  inside the DALI pipeline figure), one process per core over the same files, nothing else.
- ceiling "decode+augment": PIL decode + the imagenet scenario's augmentation (torchvision realisation),
  one process per core, no batching, no copy, no profiler.
- each pipeline and worker count through ``run_scenario(loader_only=True)``, the same path as
  ``stallscope run imagenet --loader-only`` (Session, sampler and store included).

Targets on the project's 2-core host: the best pipeline >= 0.9 of the decode+augment ceiling; prefetch with 2
workers >= 1.7x naive (naive at its default, 0 workers).

Run: ``.venv/bin/python benchmarks/loaders.py [--count 512] [--repeats 3] [--steps 12] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pipelines
from pipelines import usable_cores
from pipelines.imagefolder import ImageFolderSource
from profiler.core.steps.device_timers import cpu_name, resolve_device
from profiler.drivers.runner import RunConfig, run_scenario
from scenarios.datagen import make
from scenarios.imagenet import SCENARIO, augment_for

CORES = usable_cores()  # the cores this process may use, as many as the ceilings start processes


def _decode_pil(files: list[str]) -> int:
    from PIL import Image

    for f in files:
        with Image.open(f) as im:
            im.convert("RGB").load()
    return len(files)


def _decode_tv(files: list[str]) -> int:
    import torch
    from torchvision.io import decode_jpeg, read_file

    torch.set_num_threads(1)
    for f in files:
        decode_jpeg(read_file(f))
    return len(files)


def _decode_augment(files: list[str]) -> int:
    import torch
    from PIL import Image

    from pipelines.augment import torchvision_transform

    torch.set_num_threads(1)
    transform = torchvision_transform(augment_for("cpu"))
    for f in files:
        with Image.open(f) as im:
            transform(im.convert("RGB"))
    return len(files)


def ceiling(work: Callable[[list[str]], int], files: list[str]) -> float:
    """Images/s of ``work`` over ``files`` split across one process per core (pool start-up excluded)."""
    chunks = [files[i::CORES] for i in range(CORES)]
    with ProcessPoolExecutor(CORES) as pool:
        list(pool.map(work, [c[:4] for c in chunks]))  # start the processes and import outside the timing
        t0 = time.perf_counter()
        done = sum(pool.map(work, chunks))
        return done / (time.perf_counter() - t0)


def loader_only(data: Path, pipeline: str, workers: int, steps: int, batch: int) -> float:
    """Samples/s of ``stallscope run imagenet --loader-only`` with this pipeline and worker count."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig(
            out=Path(tmp) / "run",
            device=resolve_device("cpu"),
            pipeline=pipeline,
            batch_size=batch,
            workers=workers,
            steps=steps,
            warmup=2,
            attribution=False,
            data=data,
            loader_only=True,
        )
        return float(run_scenario(SCENARIO, cfg).summary().throughput_samples_per_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=512, help="imagenet-like images to generate (cached)")
    ap.add_argument("--data", help="use this ImageFolder instead of generating one")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="measured batches per loader-only run")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)

    data = Path(args.data) if args.data else Path(tempfile.gettempdir()) / f"stallscope-bench-imagenet-{args.count}"
    if not args.data:
        make("imagenet-like", data, args.count, classes=10)
    files = list(ImageFolderSource.scan(data).files)
    sizes = [os.path.getsize(f) for f in files]
    print(f"data: {len(files)} JPEGs, mean {statistics.fmean(sizes) / 1024:.0f} KB, {data}", file=sys.stderr)

    variants: dict[str, Callable[[], float]] = {
        "ceiling decode (PIL)": lambda: ceiling(_decode_pil, files),
        "ceiling decode (torchvision.io)": lambda: ceiling(_decode_tv, files),
        "ceiling decode+augment (PIL + v2)": lambda: ceiling(_decode_augment, files),
    }
    grid = [("naive", 0), ("naive", 2), ("prefetch", 0), ("prefetch", 2), ("dali", 1), ("dali", 2)]
    for name, workers in grid:
        try:
            pipelines.get(name)
        except pipelines.PipelineError as exc:
            print(f"skip {name}: {exc}", file=sys.stderr)
            continue
        variants[f"{name} workers={workers}"] = lambda n=name, w=workers: loader_only(  # type: ignore[misc]
            data, n, w, args.steps, args.batch
        )
    results: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.repeats):
        for key, fn in variants.items():
            results[key].append(fn())
            print(f"round {r + 1}: {key}: {results[key][-1]:.0f} images/s", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in results.items()}
    ceiling_aug = med["ceiling decode+augment (PIL + v2)"]
    loaders = {k: v for k, v in med.items() if not k.startswith("ceiling")}
    best = max(loaders, key=loaders.__getitem__) if loaders else None
    out: dict[str, Any] = {
        "machine": cpu_name(),
        "images": len(files),
        "mean_kb": statistics.fmean(sizes) / 1024,
        "batch": args.batch,
        "repeats": args.repeats,
        "median_images_per_s": med,
        "runs": results,
        "best_pipeline": best,
        "best_vs_decode_augment_ceiling": loaders[best] / ceiling_aug if best else None,
    }
    if "naive workers=0" in med and "prefetch workers=2" in med:
        out["prefetch_w2_vs_naive"] = med["prefetch workers=2"] / med["naive workers=0"]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"{'variant':36s} {'median img/s':>12s}  runs")
    for k, v in med.items():
        print(f"{k:36s} {v:12.0f}  " + " ".join(f"{x:.0f}" for x in results[k]))
    if best:
        print(f"best pipeline: {best}: {out['best_vs_decode_augment_ceiling']:.2f} of the decode+augment ceiling")
    if "prefetch_w2_vs_naive" in out:
        print(f"prefetch workers=2 vs naive (workers=0): {out['prefetch_w2_vs_naive']:.2f}x")


if __name__ == "__main__":
    main()
