"""py-spy output -> stack samples, and which process and thread of a training job each one came from.

Pure: takes the text py-spy wrote (``--format raw``, the collapsed-stack format, or ``--format speedscope``)
and returns :class:`StackSample` objects; runs nothing, reads no file or clock. What py-spy 0.4 writes, with
recorded examples: ``tests/data/pyspy/README.md``. Neither format marks idle samples: see :func:`infer_idle`.
Invariants:
- Parsing never raises on bad input: unparsable records are skipped and counted in :class:`ParseStats`.
- Frames are root first; the process and thread pseudo-frames are never in ``frames``.
- A pid's command line (unescaped, the same in every record) is split where its first record fixed its end:
  at the first ``";`` that is followed by something shaped like a frame.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

WORKER_LOOP = ("torch/utils/data/_utils/worker.py", "_worker_loop")

_PROCESS_HEAD = re.compile(r'process (\d+):"')
_THREAD = re.compile(r"thread \(([^)]*)\)(?:: (.*))?", re.DOTALL)
_FRAME = re.compile(r"(.*?) \((.*?)(?::(\d+))?\)", re.DOTALL)
_SPEEDSCOPE_PROFILE = re.compile(r'(?:Process (\d+) )?Thread (\S+) "(.*)"', re.DOTALL)
_IMPORT_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>")
_EXAMPLES = 3
_EXAMPLE_CHARS = 160

# Innermost frames that mean "blocked, not running": py-spy's own fallback heuristic (threading wait,
# selectors select) plus the waits a DataLoader's processes sit in. ``Connection._recv``/``_send`` are
# the os.read/os.write loops of a pipe or socket: a thread found there is nearly always waiting for its
# peer (the resource sharer's handshake with the main process, a full pipe), the copy itself is cheap.
# A C-level block (time.sleep, a lock acquire) leaves only its Python caller on the stack and so cannot
# be recognised here.
_IDLE_INNERMOST: tuple[tuple[str, frozenset[str]], ...] = (
    ("threading.py", frozenset({"wait", "_wait_for_tstate_lock"})),
    ("selectors.py", frozenset({"select"})),
    ("multiprocessing/connection.py", frozenset({"wait", "poll", "_poll", "accept", "_recv", "_send"})),
    ("multiprocessing/popen_fork.py", frozenset({"wait", "poll"})),
    ("socket.py", frozenset({"accept"})),
)


@dataclass(frozen=True, slots=True)
class Frame:
    function: str  # as py-spy printed it: a qualified name on 3.11+ with py-spy >= 0.4.3, else the bare name
    file: str  # py-spy's short path (``torch/nn/modules/module.py``) or a full one; "" when py-spy gave none
    line: int | None = None  # None when py-spy printed no line (line 0, ``--nolineno``)

    @property
    def name(self) -> str:
        """The bare function name, the same whichever form py-spy printed.

        ``Module._call_impl`` -> ``_call_impl``, ``f.<locals>.<listcomp>`` -> ``<listcomp>``, ``<module>`` stays.
        """
        fn = self.function
        if fn.endswith(">") and ".<" in fn:
            return "<" + fn.rpartition(".<")[2]
        return fn if fn.startswith("<") else fn.rpartition(".")[2]

    def label(self) -> str:
        return f"{self.function} ({self.file})" if self.file else self.function


@dataclass(frozen=True, slots=True)
class StackSample:
    pid: int | None  # None: recorded without --subprocesses
    process: str | None  # the command line, argv joined by spaces, exactly as py-spy printed it
    thread: str | None  # thread id as printed ("18383" or "0x7F..."); None: recorded without --threads
    frames: tuple[Frame, ...]  # root first
    count: int
    idle: bool  # inferred, see infer_idle: neither format carries py-spy's own idle flag
    thread_name: str | None = None
    parent_pids: tuple[int, ...] = ()  # ancestors that py-spy also sampled, root first
    order: int | None = None  # position in its thread's sampling order (speedscope only)


@dataclass(frozen=True, slots=True)
class ParseStats:
    lines: int = 0  # physical lines (raw) or profiles (speedscope)
    records: int = 0  # stacks parsed
    samples: int = 0  # sum of their counts
    blank_lines: int = 0
    bad_records: int = 0  # skipped: no count, a malformed process or thread frame, unreadable speedscope entry
    truncated: int = 0  # the final record had no newline and did not parse: the file was cut off
    unterminated: bool = False  # the final record had no newline but parsed: its count may have lost digits
    examples: tuple[str, ...] = ()  # the first few bad records, clipped
    error: str | None = None  # why a whole speedscope file could not be read


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes in ``n`` trials (95% by default); (0, 1) when n == 0.

    Fits py-spy's samples: its timer draws exponential gaps (a Poisson process), so given n samples of one
    thread, the number that land in a phase is binomial in n with the phase's true share of the time.
    """
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    # the exact bounds at k == 0 and k == n are 0 and 1; float rounding would miss them by 1e-16
    return (0.0 if k <= 0 else max(0.0, centre - half)), (1.0 if k >= n else min(1.0, centre + half))


def file_matches(file: str, pattern: str) -> bool:
    """Whether ``file`` is ``pattern`` or ends with ``/pattern`` (a folder when ``pattern`` ends with "/").

    Works for py-spy's short paths and for ``--full-filenames`` alike; Windows separators are normalised.
    """
    path = "/" + file.replace("\\", "/")
    if pattern.endswith("/"):
        return ("/" + pattern) in path
    return path.endswith("/" + pattern)


def is_import_frame(frame: Frame) -> bool:
    return frame.file in _IMPORT_FILES


def infer_idle(frames: Sequence[Frame]) -> bool:
    """Whether the innermost frame is a known blocking wait (see ``_IDLE_INNERMOST``)."""
    if not frames:
        return False
    inner = frames[-1]
    return any(file_matches(inner.file, f) and inner.name in names for f, names in _IDLE_INNERMOST)


def parse_frame(text: str) -> Frame:
    m = _FRAME.fullmatch(text)
    if m is None:
        return Frame(text, "", None)
    line = int(m.group(3)) if m.group(3) else 0
    return Frame(m.group(1), m.group(2), line or None)


def _looks_like_frame_start(rest: str) -> bool:
    # What may follow a process pseudo-frame: another process, a thread, or a Python frame.
    if _PROCESS_HEAD.match(rest) or rest.startswith("thread ("):
        return True
    return _FRAME.fullmatch(rest.split(";", 1)[0]) is not None


def _split_processes(stack: str, known: dict[int, str]) -> tuple[list[tuple[int, str]], str] | None:
    """Peel the leading ``process PID:"CMD"`` pseudo-frames off; None when one of them is malformed."""
    procs: list[tuple[int, str]] = []
    rest = stack
    while (m := _PROCESS_HEAD.match(rest)) is not None:
        pid = int(m.group(1))
        body = rest[m.end() :]
        cmd = known.get(pid)
        if cmd is not None and (body == cmd + '"' or body.startswith(cmd + '";')):
            end = len(cmd)
        else:
            end = -1
            pos = body.find('";')
            while pos >= 0:
                if _looks_like_frame_start(body[pos + 2 :]):
                    end = pos
                    break
                pos = body.find('";', pos + 1)
            if end < 0:
                if not body.endswith('"'):
                    return None
                end = len(body) - 1
            known[pid] = body[:end]
        procs.append((pid, body[:end]))
        rest = body[end + 2 :]
    return procs, rest


def _split_thread(segments: list[str]) -> tuple[str | None, str | None, list[str]] | None:
    """Take the ``thread (TID)[: NAME]`` pseudo-frame off the front; a name may itself contain ``;``."""
    if not segments or not segments[0].startswith("thread ("):
        return None, None, segments
    m = _THREAD.fullmatch(segments[0])
    if m is None:
        return None
    name = m.group(2)
    i = 1
    if name is not None:
        while i < len(segments) and _FRAME.fullmatch(segments[i]) is None:
            name += ";" + segments[i]
            i += 1
    return m.group(1), name, segments[i:]


def _parse_record(record: str, known: dict[int, str]) -> StackSample | None:
    stack, sep, count_text = record.rpartition(" ")
    if not sep or not (count_text.isascii() and count_text.isdigit()) or int(count_text) <= 0:
        return None
    split = _split_processes(stack, known)
    if split is None:
        return None
    procs, rest = split
    thread = _split_thread(rest.split(";") if rest else [])
    if thread is None:
        return None
    tid, tname, segments = thread
    frames = tuple(parse_frame(s) for s in segments)
    pid, cmd = procs[-1] if procs else (None, None)
    return StackSample(
        pid=pid,
        process=cmd,
        thread=tid,
        thread_name=tname,
        frames=frames,
        count=int(count_text),
        idle=infer_idle(frames),
        parent_pids=tuple(p for p, _ in procs[:-1]),
    )


def _records(text: str) -> tuple[list[str], int, int]:
    """Join physical lines into records: (records, physical lines, blank lines).

    With ``--subprocesses`` every record starts ``process PID:"``, so a line that does not is the rest of
    a command-line argument that held a newline; without it there are no command lines and no joins.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    first = next((ln for ln in lines if ln.strip()), "")
    joined = _PROCESS_HEAD.match(first) is not None
    records: list[str] = []
    blank = 0
    for ln in lines:
        if not ln.strip():
            blank += 1
            continue
        if joined and records and _PROCESS_HEAD.match(ln) is None:
            records[-1] += "\n" + ln
        else:
            records.append(ln)
    return records, len(lines), blank


def parse_collapsed_stats(text: str) -> tuple[list[StackSample], ParseStats]:
    """Parse py-spy ``--format raw`` text; see the module docstring for the format."""
    records, nlines, blank = _records(text)
    terminated = text.endswith("\n") or not records
    known: dict[int, str] = {}
    samples: list[StackSample] = []
    bad: list[str] = []
    truncated = 0
    for i, rec in enumerate(records):
        s = _parse_record(rec, known)
        if s is None:
            if i == len(records) - 1 and not terminated:
                truncated = 1
            else:
                bad.append(rec)
            continue
        samples.append(s)
    stats = ParseStats(
        lines=nlines,
        records=len(samples),
        samples=sum(s.count for s in samples),
        blank_lines=blank,
        bad_records=len(bad),
        truncated=truncated,
        unterminated=not terminated and not truncated,
        examples=tuple(b[:_EXAMPLE_CHARS] for b in bad[:_EXAMPLES]),
    )
    return samples, stats


def parse_collapsed(text: str) -> list[StackSample]:
    return parse_collapsed_stats(text)[0]


def parse_speedscope_stats(text: str) -> tuple[list[StackSample], ParseStats]:
    """Parse py-spy ``--format speedscope`` JSON into one sample per entry, ``order`` set, count 1."""
    try:
        doc = json.loads(text)
        shared = doc["shared"]["frames"]
        profiles = doc["profiles"]
    except (ValueError, KeyError, TypeError) as e:
        return [], ParseStats(error=f"not a speedscope file: {type(e).__name__}: {e}"[:_EXAMPLE_CHARS])
    table = [_speedscope_frame(f) for f in shared] if isinstance(shared, list) else []
    samples: list[StackSample] = []
    bad: list[str] = []
    for prof in profiles if isinstance(profiles, list) else []:
        try:
            m = _SPEEDSCOPE_PROFILE.fullmatch(str(prof.get("name", "")))
            entries = list(prof["samples"])
        except (KeyError, TypeError, AttributeError) as e:
            bad.append(f"profile {prof!r}: {e}")
            continue
        for order, entry in enumerate(entries):
            try:
                sample = _speedscope_sample([table[i] for i in entry], order, m)
            except (TypeError, IndexError):
                sample = None
            if sample is None:
                bad.append(str(entry))
            else:
                samples.append(sample)
    stats = ParseStats(
        lines=len(profiles) if isinstance(profiles, list) else 0,
        records=len(samples),
        samples=len(samples),
        bad_records=len(bad),
        examples=tuple(b[:_EXAMPLE_CHARS] for b in bad[:_EXAMPLES]),
    )
    return samples, stats


def parse_speedscope(text: str) -> list[StackSample]:
    return parse_speedscope_stats(text)[0]


def _speedscope_frame(f: object) -> Frame:
    line = f.get("line") if isinstance(f, dict) else None
    return Frame(
        str(f.get("name", "")) if isinstance(f, dict) else str(f),
        str(f.get("file") or "") if isinstance(f, dict) else "",
        line if isinstance(line, int) and line > 0 else None,
    )


def _speedscope_sample(frames: list[Frame], order: int, profile: re.Match[str] | None) -> StackSample | None:
    procs: list[tuple[int, str]] = []
    i = 0
    while i < len(frames) and not frames[i].file and (m := _PROCESS_HEAD.match(frames[i].function)):
        if not frames[i].function.endswith('"'):
            return None
        procs.append((int(m.group(1)), frames[i].function[m.end() : -1]))
        i += 1
    tid: str | None = profile.group(2) if profile else None
    tname: str | None = (profile.group(3) or None) if profile else None
    if i < len(frames) and not frames[i].file and (t := _THREAD.fullmatch(frames[i].function)):
        tid, tname = t.group(1), t.group(2)
        i += 1
    py = tuple(frames[i:])
    pid = procs[-1][0] if procs else (int(profile.group(1)) if profile and profile.group(1) else None)
    return StackSample(
        pid=pid,
        process=procs[-1][1] if procs else None,
        thread=tid,
        thread_name=tname,
        frames=py,
        count=1,
        idle=infer_idle(py),
        parent_pids=tuple(p for p, _ in procs[:-1]),
        order=order,
    )


# --- who is who ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Roles:
    """Which samples are the training process's main thread, which are DataLoader workers.

    Main process: ``root_pid`` when it has samples, else the sampled process with the fewest sampled
    ancestors (most samples on a tie); None when the recording has no process frames (no --subprocesses).
    Main thread, first rule that applies (``main_rule`` names it):
      1. ``tid == pid``: on Linux the main thread's native id equals the process id;
      2. ``MainThread``: the thread named so (threading's name; a thread's first samples, taken before
         ``threading`` was imported, carry no name but the same id and are included);
      3. ``<module> root``: the thread with most samples whose outermost frame is ``<module>``;
      4. ``not a threading root``: no thread frames (no --threads): every stack whose outermost frame is not
         ``threading``'s ``_bootstrap``, since every other thread starts there.
    Workers: other processes with a ``_worker_loop`` frame in ``torch/utils/data/_utils/worker.py``.
    """

    main_pid: int | None
    main_thread: str | None
    main_rule: str
    worker_pids: tuple[int, ...] = ()
    other_pids: tuple[int, ...] = ()
    threads: dict[str, str] = field(default_factory=dict)  # main process: thread id -> last name seen

    def is_main_process(self, s: StackSample) -> bool:
        return self.main_pid is None or s.pid == self.main_pid

    def is_main_thread(self, s: StackSample) -> bool:
        if not self.is_main_process(s):
            return False
        if self.main_thread is not None:
            return s.thread == self.main_thread
        return s.thread is None and not _threading_root(s.frames)

    def is_worker(self, s: StackSample) -> bool:
        return s.pid is not None and s.pid in self.worker_pids


def _threading_root(frames: Sequence[Frame]) -> bool:
    return bool(frames) and frames[0].name == "_bootstrap" and file_matches(frames[0].file, "threading.py")


def has_frame(frames: Iterable[Frame], file: str, name: str) -> bool:
    return any(f.name == name and file_matches(f.file, file) for f in frames)


def identify(samples: Sequence[StackSample], root_pid: int | None = None) -> Roles:
    """Find the main process, its main thread and the DataLoader workers (rules on :class:`Roles`)."""
    per_pid: Counter[int] = Counter()
    depth: dict[int, int] = {}
    for s in samples:
        if s.pid is not None:
            per_pid[s.pid] += s.count
            depth[s.pid] = min(depth.get(s.pid, len(s.parent_pids)), len(s.parent_pids))
    if root_pid is not None and per_pid[root_pid] > 0:
        main_pid: int | None = root_pid
    elif per_pid:
        main_pid = min(per_pid, key=lambda p: (depth[p], -per_pid[p], p))
    else:
        main_pid = None
    mine = [s for s in samples if s.pid == main_pid]
    threads: dict[str, str] = {}
    for s in mine:
        if s.thread is not None and (s.thread_name or s.thread not in threads):
            threads[s.thread] = s.thread_name or ""
    main_thread, rule = _main_thread(mine, main_pid, threads)
    workers = {s.pid for s in samples if s.pid is not None and s.pid != main_pid and has_frame(s.frames, *WORKER_LOOP)}
    others = set(per_pid) - workers - {main_pid}
    return Roles(main_pid, main_thread, rule, tuple(sorted(workers)), tuple(sorted(others)), threads)


def _main_thread(mine: Sequence[StackSample], pid: int | None, threads: dict[str, str]) -> tuple[str | None, str]:
    if not threads:
        return None, "not a threading root"
    if pid is not None and str(pid) in threads:
        return str(pid), "tid == pid"
    named = sorted(t for t, n in threads.items() if n == "MainThread")
    if named:
        return named[0], "MainThread"
    roots: Counter[str] = Counter()
    for s in mine:
        if s.thread is not None and s.frames and s.frames[0].name == "<module>":
            roots[s.thread] += s.count
    if roots:
        return roots.most_common(1)[0][0], "<module> root"
    return None, "not found"


def worker_frames(frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
    """A worker's own frames: from the innermost ``_worker_loop`` in, dropping the stack it inherited by fork."""
    for i in range(len(frames) - 1, -1, -1):
        f = frames[i]
        if f.name == WORKER_LOOP[1] and file_matches(f.file, WORKER_LOOP[0]):
            return frames[i:]
    return frames


def chunk_by_order(samples: Sequence[StackSample], rate_hz: float, window_s: float) -> list[list[StackSample]]:
    """Split ordered (speedscope) samples into windows of about ``window_s`` seconds each.

    Sample k of a thread recorded with ``--idle`` was taken about k/rate seconds after that thread's first
    sample (every tick samples every thread; the gaps are random with mean 1/rate, so the error grows like
    sqrt(k)/rate). Without ``--idle`` idle ticks are missing and the windows stretch over more time.
    ValueError for samples without an order (raw output has none: record successive chunks instead).
    """
    if rate_hz <= 0 or window_s <= 0:
        raise ValueError(f"rate_hz and window_s must be > 0, got {rate_hz} and {window_s}")
    per = max(1, round(rate_hz * window_s))
    chunks: list[list[StackSample]] = []
    for s in samples:
        if s.order is None:
            raise ValueError("samples have no order (py-spy raw output): use speedscope output or chunked runs")
        k = s.order // per
        while len(chunks) <= k:
            chunks.append([])
        chunks[k].append(s)
    return chunks
