"""Stack samples -> where the training loop's time goes, and what DataLoader workers spend their CPU on.

Pure: works on :class:`~profiler.analysis.stacks.StackSample` lists from ``stacks.parse_collapsed`` or
``stacks.parse_speedscope``; runs nothing, reads no file or clock. The rules are the tables below:
:data:`MAIN_RULES` gives each main-thread sample one phase by priority, not position (all of ``next(loader)``
is data wait, even where transforms run in it); :data:`WORKER_RULES` gives each non-idle worker sample a
category, trying frames from the innermost outwards up to ``_worker_loop``. docs/zero-code.md ("How the
estimate is made", "Loader attribution") states them, what py-spy cannot see (no ``--native``: a C call shows
as its caller's line, so h2d counts only at :func:`find_copy_sites` lines or in Python movers) and why
recordings use ``--idle`` and never ``--gil``. Shares come with Wilson 95% intervals.
"""

from __future__ import annotations

import ast
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from profiler.analysis.stacks import Frame, Roles, StackSample, file_matches, identify, is_import_frame, wilson
from profiler.analysis.stacks import worker_frames as _own_frames

PHASES = ("data_wait", "h2d", "compute", "other")
CATEGORIES = ("file_read", "decode", "augment", "collate", "ipc_pickling", "other")
COPY_METHODS = frozenset({"to", "cuda", "copy_", "pin_memory"})
_TOP = 5
_PIN_FILE = "torch/utils/data/_utils/pin_memory.py"


@dataclass(frozen=True, slots=True)
class Rule:
    """``category`` when a frame's path matches ``path`` (a regex searched in "/" + the frame's file; ""
    matches any) and its bare name is in ``names`` (empty: any) or matches ``name_re`` (when given)."""

    category: str
    path: str = ""
    names: frozenset[str] = frozenset()
    name_re: str = ""
    innermost_only: bool = False  # only when the frame is the innermost one (the function itself is running)

    def matches(self, frame: Frame) -> bool:
        if self.path and re.search(self.path, "/" + frame.file.replace("\\", "/")) is None:
            return False
        if self.names and frame.name not in self.names:
            return False
        return not self.name_re or re.search(self.name_re, frame.name) is not None


def _rule(category: str, path: str = "", names: str = "", name_re: str = "", innermost_only: bool = False) -> Rule:
    return Rule(category, path, frozenset(names.split()), name_re, innermost_only)


MAIN_RULES: tuple[Rule, ...] = (
    _rule(
        "data_wait",
        r"/torch/utils/data/dataloader\.py$",
        # next(); and iter() and the iterator's shutdown, which start and stop the workers every epoch
        "__next__ _next_data _get_data _try_get_data _next_index __iter__ _get_iterator _shutdown_workers",
    ),
    _rule("data_wait", r"/nvidia/dali/", "__next__ next"),
    # stallscope's own prefetch pipeline: the training thread waits here for the prefetch thread's batch
    _rule("data_wait", r"/pipelines/prefetch\.py$", "_deliver take __iter__"),
    _rule("data_wait", r"/torchdata/", "__next__"),
    _rule("h2d", r"/torch/utils/data/_utils/pin_memory\.py$"),
    _rule("h2d", r"/(lightning|pytorch_lightning|lightning_fabric)/", "move_data_to_device batch_to_device"),
    _rule("h2d", r"/accelerate/", "send_to_device"),
    _rule("h2d", r"/transformers/", "to"),
    _rule("compute", r"/torch/(nn/modules|nn/parallel|autograd|optim|amp|_dynamo|_inductor|_functorch)/"),
    _rule("compute", r"/torch/(nn/functional|utils/checkpoint)\.py$"),
    _rule("compute", r"/torch/_tensor\.py$", "backward"),
)

# Ordered: within one frame the first matching rule wins, so library rules come before the name keywords
# that are a last resort for a dataset's own helpers (``decode_sample``, ``read_bytes``, ``augment``).
WORKER_RULES: tuple[Rule, ...] = (
    _rule("file_read", r"/torchvision/io/image\.py$", "read_file"),
    _rule("decode", r"/torchvision/io/", "decode_jpeg decode_image decode_png decode_webp decode_gif read_image"),
    _rule("decode", r"/PIL/ImageFile\.py$"),
    _rule("decode", r"/PIL/\w*ImagePlugin\.py$"),
    _rule("decode", r"/PIL/Image\.py$", "load"),
    _rule("decode", r"/(turbojpeg|simplejpeg)\.py$|/(imageio|skimage/io|torchaudio|soundfile|av)/"),
    _rule("file_read", r"/PIL/Image\.py$", "open"),  # the file open and format sniff; decoding is lazy
    _rule("file_read", r"/pathlib\.py$", "read_bytes read_text open"),
    _rule("file_read", r"/(gzip|bz2|lzma|zipfile|tarfile|_compression|_pyio|codecs)\.py$"),
    _rule("file_read", r"/(h5py|fsspec|s3fs|gcsfs|botocore|boto3|smart_open|lmdb|zarr)/"),
    _rule("file_read", r"/numpy/lib/_?npyio(_impl)?\.py$|/numpy/lib/_?format(_impl)?\.py$"),
    _rule("augment", r"/torchvision/transforms/|/albumentations/|/kornia/|/imgaug/|/timm/data/"),
    _rule("augment", r"/PIL/Image(Ops|Enhance|Filter|Draw|Chops)\.py$"),
    _rule(
        "augment",
        r"/PIL/Image\.py$",
        "resize crop rotate transpose transform convert filter thumbnail reduce point paste split merge tobytes",
    ),
    _rule("collate", r"/torch/utils/data/_utils/collate\.py$"),
    _rule("ipc_pickling", r"/multiprocessing/(queues|connection|reduction|resource_sharer|synchronize)\.py$"),
    _rule("ipc_pickling", r"/torch/multiprocessing/reductions\.py$|/(pickle|copyreg)\.py$"),
    _rule("ipc_pickling", r"/torch/utils/data/_utils/worker\.py$", innermost_only=True),
    _rule("decode", name_re=r"decode"),
    _rule("file_read", name_re=r"(^|_)read(_|$)|^load_(file|bytes)"),
    _rule("augment", name_re=r"augment|transform"),
    _rule("collate", name_re=r"collate"),
)

_ADVICE = {
    "decode": "image decode: consider DALI (decode on the GPU) or smaller images",
    "augment": "augmentation: consider GPU augmentation (DALI, kornia) or cheaper transforms",
    "file_read": "file reading: consider faster storage, caching the data set, or packing files into larger shards",
    "collate": "batch collation: consider fixed-size tensors or a simpler collate_fn",
    "ipc_pickling": (
        "passing data between processes (pickling, queues): consider returning tensors rather than Python "
        "objects, or fewer, larger samples"
    ),
}


@dataclass(frozen=True, slots=True)
class Share:
    count: int
    n: int
    fraction: float  # count / n; NaN when n == 0
    low: float  # Wilson 95% interval; (0, 1) when n == 0
    high: float


def share(count: int, n: int) -> Share:
    lo, hi = wilson(count, n)
    return Share(count, n, count / n if n else math.nan, lo, hi)


@dataclass(frozen=True, slots=True)
class PhaseFractions:
    n: int  # main-thread samples in scope
    excluded: int  # main-thread samples with no Python frame or inside imports (start-up)
    seconds: float  # (n + excluded) / rate: the main thread's sampled time
    shares: dict[str, Share]  # PHASES -> share of n


@dataclass(frozen=True, slots=True)
class PhaseEstimate:
    overall: PhaseFractions  # all chunks pooled
    windows: tuple[PhaseFractions, ...]  # one per chunk given, in order
    rate_hz: float
    main_rule: str  # how the main thread was found (first chunk's; see stacks.Roles)
    pin_memory_samples: int  # busy samples of a pin-memory thread in the main process
    notes: tuple[str, ...]


def classify_main_sample(frames: Sequence[Frame], h2d_sites: Iterable[tuple[str, int]] = ()) -> str:
    """One main-thread stack's phase, or ``"excluded"``; see the module docstring for the rules."""
    if not frames or any(is_import_frame(f) for f in frames):
        # importing torch runs torch/nn/... module bodies: start-up, not compute
        return "excluded"
    for phase in PHASES[:3]:
        if any(r.category == phase and r.matches(f) for r in MAIN_RULES for f in frames):
            return phase
        if phase == "h2d" and _on_site(frames[-1], h2d_sites):
            return phase
    return "other"


def _on_site(frame: Frame, sites: Iterable[tuple[str, int]]) -> bool:
    # Either path may be the short one: py-spy shortens to the package part, callers may pass full paths.
    return frame.line is not None and any(
        line == frame.line and (file_matches(frame.file, f) or file_matches(f, frame.file)) for f, line in sites
    )


def _fractions(counts: Counter[str], rate_hz: float) -> PhaseFractions:
    n = sum(counts[p] for p in PHASES)
    return PhaseFractions(
        n=n,
        excluded=counts["excluded"],
        seconds=(n + counts["excluded"]) / rate_hz,
        shares={p: share(counts[p], n) for p in PHASES},
    )


def classify_main(
    chunks: Sequence[Sequence[StackSample]],
    *,
    rate_hz: float,
    root_pid: int | None = None,
    h2d_sites: Iterable[tuple[str, int]] = (),
) -> PhaseEstimate:
    """Main-thread phase fractions, pooled and per chunk.

    ``chunks``: one list of samples per time window (raw output has no time order, so windows need one py-spy
    run per window, or speedscope output split by ``stacks.chunk_by_order``); ``[samples]`` for one
    estimate. ``rate_hz``: the ``--rate`` py-spy ran at. Roles are found per chunk (``stacks.identify``).
    """
    if rate_hz <= 0:
        raise ValueError(f"rate_hz must be > 0, got {rate_hz}")
    sites = tuple(h2d_sites)
    total: Counter[str] = Counter()
    windows: list[PhaseFractions] = []
    rules: list[str] = []
    pin = 0
    cache: dict[tuple[Frame, ...], str] = {}  # speedscope repeats the same stacks thousands of times
    for chunk in chunks:
        roles = identify(chunk, root_pid)
        rules.append(roles.main_rule)
        counts: Counter[str] = Counter()
        for s in chunk:
            if roles.is_main_thread(s):
                phase = cache.get(s.frames)
                if phase is None:
                    phase = cache[s.frames] = classify_main_sample(s.frames, sites)
                counts[phase] += s.count
            elif roles.is_main_process(s) and not s.idle and _is_pin_thread(s.frames):
                pin += s.count
        total.update(counts)
        windows.append(_fractions(counts, rate_hz))
    overall = _fractions(total, rate_hz)
    notes = []
    if not sites:
        notes.append(
            "h2d: .to()/.cuda() are C calls with no Python frame; without h2d_sites only Python-level copy "
            "helpers count, other copies are in 'other'"
        )
    if total and all(r == "not a threading root" for r in rules):
        notes.append("no thread ids (record with --threads): main thread = stacks not started by threading")
    if overall.n == 0:
        notes.append("no main-thread samples found")
    return PhaseEstimate(overall, tuple(windows), rate_hz, rules[0] if rules else "not found", pin, tuple(notes))


def _is_pin_thread(frames: Sequence[Frame]) -> bool:
    return any(f.name == "_pin_memory_loop" and file_matches(f.file, _PIN_FILE) for f in frames)


def find_copy_sites(source: str, filename: str) -> frozenset[tuple[str, int]]:
    """Lines of ``source`` that call ``.to(``, ``.cuda(``, ``.copy_(`` or ``.pin_memory(``: ``h2d_sites``.

    A C call leaves its caller standing on the call's line; every line a multi-line call spans is listed,
    since which one the interpreter reports differs between versions. A ``.to(`` that converts dtype only
    is listed too: the source alone cannot tell. ValueError when ``source`` does not parse.
    """
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as e:
        raise ValueError(f"cannot parse {filename}: {e.msg} (line {e.lineno})") from None
    sites: set[tuple[str, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in COPY_METHODS:
            end = node.end_lineno or node.lineno
            sites.update((filename, ln) for ln in range(node.lineno, end + 1))
    return frozenset(sites)


# --- workers ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TopFunction:
    function: str  # "qualname (file)"
    count: int
    of_category: float  # count / the category's samples
    of_active: float  # count / all non-idle worker samples


@dataclass(frozen=True, slots=True)
class WorkerAttribution:
    worker_pids: tuple[int, ...]
    samples: int  # all worker samples, idle included
    idle: int
    active: int
    shares: dict[str, Share]  # CATEGORIES -> share of ``active``
    top: dict[str, tuple[TopFunction, ...]]  # CATEGORIES -> up to 5 functions, most samples first
    busy_seconds: float | None  # active / rate: thread-seconds not idle, when rate_hz was given
    roles: Roles | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)


def classify_worker_frames(frames: tuple[Frame, ...], rules: Sequence[Rule] = WORKER_RULES) -> tuple[str, Frame | None]:
    """The category of one worker stack and the frame that decided it (the innermost frame for ``other``)."""
    own = _own_frames(frames)
    last = len(own) - 1
    for i in range(last, -1, -1):
        f = own[i]
        for r in rules:
            if (i == last or not r.innermost_only) and r.matches(f):
                return r.category, f
    return "other", own[-1] if own else None


def attribute_workers(
    samples: Sequence[StackSample],
    *,
    root_pid: int | None = None,
    rate_hz: float | None = None,
    rules: Sequence[Rule] = WORKER_RULES,
) -> WorkerAttribution:
    """Worker CPU by category (see the module docstring); workers are found by ``stacks.identify``."""
    roles = identify(samples, root_pid)
    counts: Counter[str] = Counter()
    funcs: dict[str, Counter[str]] = {c: Counter() for c in CATEGORIES}
    idle = unread = 0
    cache: dict[tuple[Frame, ...], tuple[str, Frame | None]] = {}
    for s in samples:
        if not roles.is_worker(s):
            continue
        if s.idle:
            idle += s.count
            continue
        if not s.frames:  # py-spy read no stack (a busy host; a process starting or ending): nothing to attribute
            unread += s.count
            continue
        hit = cache.get(s.frames)
        if hit is None:
            hit = cache[s.frames] = classify_worker_frames(s.frames, rules)
        cat, frame = hit
        counts[cat] += s.count
        funcs[cat][frame.label() if frame else "(no Python frame)"] += s.count
    active = sum(counts.values())
    top = {
        c: tuple(TopFunction(name, k, k / counts[c], k / active) for name, k in funcs[c].most_common(_TOP))
        for c in CATEGORIES
    }
    notes: list[str] = []
    if not roles.worker_pids:
        notes.append("no DataLoader worker process found (record with --subprocesses; num_workers > 0?)")
    if unread:
        notes.append(f"{unread} busy worker sample(s) with no Python frame (py-spy read no stack): not in the shares")
    return WorkerAttribution(
        worker_pids=roles.worker_pids,
        samples=active + idle + unread,
        idle=idle,
        active=active,
        shares={c: share(counts[c], active) for c in CATEGORIES},
        top=top,
        busy_seconds=active / rate_hz if rate_hz else None,
        roles=roles,
        notes=tuple(notes),
    )


def headline(attribution: WorkerAttribution, threshold: float = 0.5, min_samples: int = 30) -> str | None:
    """One line naming the category holding >= ``threshold`` of worker CPU and what to do about it.

    None when no category reaches it, or with fewer than ``min_samples`` active samples (too few to say).
    """
    if attribution.active < min_samples:
        return None
    cat, sh = max(attribution.shares.items(), key=lambda kv: kv[1].count)
    if not sh.fraction >= threshold:
        return None
    pct = round(100 * sh.fraction)
    if cat in _ADVICE:
        return f"{pct}% of worker CPU is {_ADVICE[cat]}"
    top = attribution.top.get(cat, ())
    where = f", mostly {top[0].function}" if top else ""
    return f"{pct}% of worker CPU is in the data set's own code{where}: profile __getitem__"


# how late py-spy first sampled a loader worker after the workers started, measured on this project's 2-core host
# beside other work (load 6-12; tests/test_cli.py, ATTRIBUTION_STEPS): what a run shorter than it misses
PYSPY_WORKER_LAG_S = (0.6, 2.8)


def unattributed_workers(meta: Mapping[str, object], attributed: bool) -> str | None:
    """Where py-spy recorded a run with loader worker processes and sampled none of them: that, and the likely why,
    in words (the report's loader attribution would otherwise be missing without a word); else None. A py-spy that
    failed is said by its own note (its ``pyspy_problem``)."""
    rate, workers = meta.get("pyspy_rate"), _worker_processes(meta)
    if attributed or not isinstance(rate, (int, float)) or rate <= 0 or meta.get("pyspy_problem") or not workers:
        return None
    low, high = PYSPY_WORKER_LAG_S
    return (
        f"py-spy ({rate:g} Hz) has no sample of the loader's {workers} worker process{'es' if workers > 1 else ''}: "
        f"no loader attribution. It samples a worker only once it has found and attached to it, measured {low:g}-"
        f"{high:g} s after the workers started on a busy 2-core host: workers that live shorter than that (a short "
        "run, or one beside other jobs) end unsampled; a longer run gives it time"
    )


def _worker_processes(meta: Mapping[str, object]) -> int:
    """The run's loader worker processes (DALI's workers are threads: py-spy has none to sample); 0 where unknown."""
    loader = meta.get("loader")
    workers = loader.get("worker_processes", loader.get("workers")) if isinstance(loader, Mapping) else None
    if not isinstance(workers, int):
        workers = meta.get("workers")
    return workers if isinstance(workers, int) and workers > 0 else 0
