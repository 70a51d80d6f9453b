"""Soak and scale: a long Session-instrumented run, then the commands that read its store back.

1. Soak. A fast loop (an in-memory "loader" that yields one tensor, an ``h2d`` phase and a small CPU matmul as
   ``compute``, one torch thread) runs ``--steps`` steps (default 100,000) three times, each in its own process:
   - ``bare``: without stallscope, for the process's RSS baseline;
   - ``session``: inside a Session at the default rate (10 Hz) with the default sources (host, sched, NVML);
   - ``traced``: the same under ``tracemalloc``, for the Python memory allocated by stallscope's own code
     (traces whose allocating frame is a file under ``profiler/``; tracemalloc slows the loop, so this run's
     timings are not used).
   ``session`` runs alone (its sampler's lateness is a figure), then ``bare`` and ``traced`` side by side.
   Every ``--every`` steps (default 10,000) each run records the RSS of its process; ``session`` adds the
   store's size on disk (``run.sqlite`` and its WAL) and the sampler's own health (``Sampler.stats``: ticks,
   missed deadlines); after the run the store's ``sampler.lateness_ms`` rows (how late each tick was against its
   absolute deadline) are summarised per window. Reported: growth per 10,000 steps of the session's RSS, of
   the session's RSS beyond the bare loop's, and of stallscope's traced Python memory; store bytes per step;
   sampler lateness (mean, p99, max) per window.
2. Scale. On the session's store (completed: its report cache written at close) and on a store of as many steps
   whose training process was killed (SIGKILL inside its ``with Session`` block, once every step was stored: the
   sampler process closed it ``interrupted`` and then wrote its report cache; nothing wrote a summary):
   ``stallscope report RUN``, ``report RUN --json``, ``report RUN --html F``, ``report RUN --trace F``, ``--html``
   and ``--trace`` together, and ``compare RUN RUN``, each in a fresh interpreter as a user runs it (``python -m
   profiler``). The killed store is timed three ways: as its sampler process left it (a fresh copy before each
   run: the cache it wrote), with no cache (a fresh copy without it before each run, as a store whose sampler
   process was killed too leaves it: the rows read in bulk, and the cache written), and its second read (the
   cache that first read wrote). Wall clock and CPU time (medians of
   ``--repeats``, after one untimed run) and the child's peak RSS (``os.wait4``'s ``ru_maxrss``). Targets: < 1 s
   and < 300 MiB each for 100,000 steps (issue #65: cache or not). Also: the trace's event count and size, the
   HTML's size, the interpreter start plus command-line parse, and whether ``report`` imports torch (never) or
   numpy (only to read the rows in bulk).

Run: ``make bench`` or ``.venv/bin/python benchmarks/soak.py [--steps 100000] [--every 10000] [--json]``
(about 5 minutes on 2 cores). ``--keep DIR`` keeps the stores; ``--scale-only [RUN_DIR]`` times the commands
without a soak: on RUN_DIR as the completed store (without RUN_DIR, one made by a fast ``Session`` loop of
``--steps`` steps) and on a killed store made the same way (``--killed DIR`` reuses one).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1024 * 1024
TARGET_S = 1.0  # issue #44: report, --html and --trace of a 100,000-step store each under 1 s (it was 2 s)
TARGET_MIB = 300.0


# -- the soak run (a child process per mode) ---------------------------------------------------------------
def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _store_bytes(run_dir: Path) -> int:
    return sum(p.stat().st_size for p in run_dir.glob("run.sqlite*"))


def _traced_profiler_bytes() -> int:
    import tracemalloc

    pkg = str(ROOT / "profiler")
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(True, f"{pkg}{os.sep}*")])
    return sum(s.size for s in snap.statistics("filename"))


def child(mode: str, steps: int, every: int, matrix: int, out: Path) -> None:
    """One soak run; prints one JSON line per checkpoint and a last one with the totals."""
    import torch

    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    if mode == "traced":
        import tracemalloc

        tracemalloc.start(1)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(matrix, matrix, generator=g), torch.randn(matrix, matrix, generator=g)

    def loader() -> Any:
        for _ in range(steps):
            yield x

    def checkpoint(step: int, session: Any) -> None:
        row: dict[str, Any] = {"step": step, "t": time.perf_counter() - t0, "rss": _rss()}
        if session is not None:
            st = session.sampler.stats
            row.update(store_bytes=_store_bytes(out), ticks=st.samples, missed=st.missed_deadlines)
        if mode == "traced":
            row["traced_profiler_bytes"] = _traced_profiler_bytes()
        print(json.dumps(row), flush=True)

    t0 = time.perf_counter()
    if mode == "bare":
        checkpoint(0, None)
        for i, xb in enumerate(loader(), 1):
            y = xb.to("cpu")
            y = y @ w
            if i % every == 0:
                checkpoint(i, None)
    else:
        from profiler import Session

        with Session(out, device="cpu", meta={"scenario": "soak"}) as s:
            checkpoint(0, s)
            for i, xb in enumerate(s.wrap(loader()), 1):
                with s.phase("h2d"):
                    y = xb.to("cpu")
                with s.phase("compute"):
                    y = y @ w
                if i % every == 0:
                    checkpoint(i, s)
            t_close = time.perf_counter()  # leaving the block closes the run: flush, read back, summary.json
        close_s = time.perf_counter() - t_close
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    done: dict[str, Any] = {"done": True, "seconds": time.perf_counter() - t0, "peak_rss": usage.ru_maxrss * 1024}
    if mode != "bare":
        done["store_bytes_closed"] = _store_bytes(out)
        done["close_s"] = close_s
    print(json.dumps(done), flush=True)


# -- the stores of --scale-only: a fast Session loop, completed or killed -------------------------------------
SCALE_LOOP = """
import os, signal, sys, time
from profiler import Session
from profiler.core.store import read_head
out, steps, kill, work = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "kill", int(sys.argv[4])
with Session(out, meta={"scenario": "soak"}) as s:
    for _ in s.wrap(range(steps)):
        with s.phase("h2d"):
            pass
        with s.phase("compute"):
            sum(range(work))
    if kill:  # every step stored (or 60 s), then killed inside the block: the sampler process closes it interrupted
        deadline = time.monotonic() + 60
        while read_head(out)[1] < steps and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
"""


def make_store(out: Path, steps: int, *, kill: bool, work: int) -> dict[str, Any]:
    """A store of ``steps`` fast steps (a compute phase of ``sum(range(work))``); ``kill``: SIGKILLed after the last
    step was stored (then its sampler process closes the store and writes the report cache: waited for, up to
    60 s). Returns what the store holds (steps, status)."""
    from profiler.runs.cache import CACHE_NAME

    shutil.rmtree(out, ignore_errors=True)
    print(f"scale: a {'killed' if kill else 'completed'} run of {steps} steps ...", file=sys.stderr, flush=True)
    argv = [str(out), str(steps), "kill" if kill else "done", str(work)]
    proc = subprocess.run([sys.executable, "-c", SCALE_LOOP, *argv], env=_env(), capture_output=True, check=False)
    if proc.returncode != (-9 if kill else 0):
        raise SystemExit(f"the scale run failed (exit {proc.returncode}):\n{proc.stderr.decode()[-2000:]}")
    facts = store_facts(out, wait_for="interrupted" if kill else None)
    deadline = time.monotonic() + 60
    while kill and not (out / CACHE_NAME).is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    return facts


def store_facts(run_dir: Path, wait_for: str | None = None) -> dict[str, Any]:
    """The store's step count and status (``wait_for``: a status its sampler process is about to write)."""
    deadline = time.monotonic() + 30
    while True:
        con = sqlite3.connect(run_dir / "run.sqlite")
        try:
            steps = con.execute("SELECT count(*) FROM steps").fetchone()[0]
            status = json.loads(con.execute("SELECT value FROM meta WHERE key = 'status'").fetchone()[0])
        finally:
            con.close()
        if wait_for is None or status == wait_for or time.monotonic() > deadline:
            return {"steps": steps, "status": status}
        time.sleep(0.2)


def start_soak(mode: str, args: argparse.Namespace, tmp: Path) -> subprocess.Popen[bytes] | None:
    """Start one soak run, its JSON lines going to ``tmp/MODE.jsonl``; None when ``--reuse`` finds that file
    complete (a soak interrupted after some of its runs resumes where it stopped)."""
    log = tmp / f"{mode}.jsonl"
    if args.reuse and log.exists() and '"done": true' in log.read_text():
        return None
    if (tmp / mode).exists():
        shutil.rmtree(tmp / mode)
    print(f"soak: {mode} run of {args.steps} steps ...", file=sys.stderr, flush=True)
    cmd = [sys.executable, __file__, "--child", mode, "--steps", str(args.steps), "--every", str(args.every)]
    cmd += ["--matrix", str(args.matrix), "--out", str(tmp / mode)]
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.PIPE)


def finish_soak(mode: str, proc: subprocess.Popen[bytes] | None, tmp: Path) -> tuple[list[dict[str, Any]], dict]:
    if proc is not None:
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"soak run '{mode}' failed (exit {proc.returncode}):\n{err.decode()[-2000:]}")
    rows = [json.loads(line) for line in (tmp / f"{mode}.jsonl").read_text().splitlines() if line.startswith("{")]
    return [r for r in rows if "done" not in r], rows[-1]


def lateness_windows(run_dir: Path, marks: list[int]) -> list[dict[str, float]]:
    """Sampler lateness (ms) per window between checkpoints, from the store's own ``sampler.lateness_ms`` rows;
    the windows are cut at the run time at which step ``mark`` ended."""
    con = sqlite3.connect(run_dir / "run.sqlite")
    try:
        ends = [0.0] + [con.execute("SELECT t_end FROM steps WHERE step = ?", (m - 1,)).fetchone()[0] for m in marks]
        out = []
        for a, b in itertools.pairwise(ends):
            q = "SELECT value FROM samples WHERE metric = 'sampler.lateness_ms' AND t >= ? AND t < ? ORDER BY value"
            vals = [v for (v,) in con.execute(q, (a, b)) if v is not None]
            out.append(
                {
                    "ticks": len(vals),
                    "mean_ms": statistics.fmean(vals) if vals else float("nan"),
                    "p99_ms": vals[min(len(vals) - 1, int(0.99 * len(vals)))] if vals else float("nan"),
                    "max_ms": vals[-1] if vals else float("nan"),
                }
            )
        return out
    finally:
        con.close()


def per_10k(rows: list[dict[str, Any]], key: str, every: int, skip: int = 1) -> float:
    """Growth of ``key`` per 10,000 steps: least-squares slope over the checkpoints after the first ``skip``
    (the first window holds start-up: imports, the sampler's first reads, SQLite's page cache)."""
    pts = [(r["step"], r[key]) for r in rows[skip:]]
    if len(pts) < 2:
        return float("nan")
    return statistics.linear_regression([p[0] for p in pts], [p[1] for p in pts]).slope * 10_000


# -- the commands that read the store ----------------------------------------------------------------------
def _env() -> dict[str, str]:
    """The children's environment: this checkout on the path, and bytecode caching on (as in an installed
    package; a ``PYTHONDONTWRITEBYTECODE`` host would otherwise compile every module on every start)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPATH": str(ROOT)}


def timed(argv: list[str], repeats: int, before: Any = None) -> dict[str, Any]:
    """Median wall and CPU (user + system) seconds and the largest peak RSS of ``python -m profiler ARGV`` over
    ``repeats`` runs after one untimed run (bytecode written, page cache warm). CPU seconds are what a busy host
    does not stretch. ``before``: called (untimed) before each run."""
    walls, cpus, peaks, rc = [], [], [], 0
    for i in range(repeats + 1):
        if before is not None:
            before()
        t = time.perf_counter()
        p = subprocess.Popen(
            [sys.executable, "-m", "profiler", *argv], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env()
        )
        _, status, usage = os.wait4(p.pid, 0)
        rc = rc or os.waitstatus_to_exitcode(status)
        if i == 0:
            continue
        walls.append(time.perf_counter() - t)
        cpus.append(usage.ru_utime + usage.ru_stime)
        peaks.append(usage.ru_maxrss * 1024)
    return {
        "argv": argv,
        "rc": rc,
        "walls": walls,
        "seconds": statistics.median(walls),
        "cpu_seconds": statistics.median(cpus),
        "peak_rss": max(peaks),
    }


def startup() -> dict[str, Any]:
    """Interpreter start plus building the command line (what every command pays), and whether ``report``
    imports torch or numpy."""
    code = "from profiler.cli import build_parser; build_parser()"
    walls = []
    for _ in range(3):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=_env())
        walls.append(time.perf_counter() - t)
    return {"seconds": min(walls)}


def imports_of_report(run_dir: Path, tmp: Path) -> dict[str, bool]:
    code = (
        "import contextlib, io, sys\nfrom profiler.cli import main\n"
        f"argv = ['report', {str(run_dir)!r}, '--html', {str(tmp / 'i.html')!r}, '--trace', {str(tmp / 'i.json')!r}]\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()): main(argv)\n"
        "print(int('torch' in sys.modules), int('numpy' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, env=_env(), capture_output=True, text=True).stdout
    torch_in, numpy_in = out.split()
    return {"torch": torch_in == "1", "numpy": numpy_in == "1"}


COMMANDS = ("report", "report --json", "report --html", "report --trace", "report --html --trace", "compare")
STATES = ("completed", "killed, as left", "killed, no cache", "killed, second read")


def _argv(command: str, run: Path, tmp: Path) -> list[str]:
    extra = {"--json": ["--json"], "--html": ["--html", str(tmp / "report.html")],
             "--trace": ["--trace", str(tmp / "trace.json")]}  # fmt: skip
    if command == "compare":
        return ["compare", str(run), str(run)]
    return ["report", str(run), *(a for flag in command.split()[1:] for a in extra[flag])]


def scale(run_dir: Path, tmp: Path, repeats: int, killed: Path | None = None) -> dict[str, Any]:
    """The commands on the completed store (its report cache: docs/store.md) and, where ``killed`` is given, on
    the killed store: as its sampler process left it (the cache it wrote as it closed the store), with no cache
    (a fresh copy without it before each run: a store whose sampler process was killed too, or code before
    issue #65; the rows read in bulk, and the cache written), and its second read (the cache that read wrote)."""
    from profiler.runs.cache import CACHE_NAME

    html, trace = tmp / "report.html", tmp / "trace.json"
    got: dict[str, Any] = {"completed": {c: timed(_argv(c, run_dir, tmp), repeats) for c in COMMANDS}}
    got["trace_events"] = len(json.loads(trace.read_text())["traceEvents"])
    got["trace_bytes"] = trace.stat().st_size
    got["html_bytes"] = html.stat().st_size
    if killed is not None:
        copy = tmp / "killed"
        got["left_cached"] = (killed / CACHE_NAME).is_file()  # written by its sampler process

        def as_left() -> None:
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(killed, copy)
            if (copy / CACHE_NAME).is_file():
                os.utime(copy / CACHE_NAME)  # the copy keeps the cache newer than the store, as it was

        def fresh() -> None:  # the killed store with no cache, no summary
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(killed, copy, ignore=shutil.ignore_patterns(f"{CACHE_NAME}*"))

        got["killed, as left"] = {c: timed(_argv(c, copy, tmp), repeats, before=as_left) for c in COMMANDS}
        got["killed, no cache"] = {c: timed(_argv(c, copy, tmp), repeats, before=fresh) for c in COMMANDS}
        fresh()
        subprocess.run([sys.executable, "-m", "profiler", *_argv("report", copy, tmp)], env=_env(), check=True,
                       capture_output=True)  # fmt: skip  # the first read, which writes the cache
        got["second_read_cached"] = (copy / CACHE_NAME).is_file()  # the code before issue #65 wrote none
        got["killed, second read"] = {c: timed(_argv(c, copy, tmp), repeats) for c in COMMANDS}
        got["killed_store"] = store_facts(killed)
    got["completed_store"] = store_facts(run_dir)
    got["startup"] = startup()
    got["report_imports"] = imports_of_report(run_dir, tmp)
    got["loadavg"] = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return got


# -- output -----------------------------------------------------------------------------------------------
def summarise(args: argparse.Namespace, runs: dict[str, Any], run_dir: Path, tmp: Path) -> dict[str, Any]:
    bare, _ = runs["bare"]
    sess, sess_done = runs["session"]
    traced, _ = runs["traced"]
    for b, s in zip(bare, sess, strict=True):
        s["rss_beyond_bare"] = s["rss"] - b["rss"]
    windows = lateness_windows(run_dir, [r["step"] for r in sess[1:]])
    killed = tmp / "killed-store"
    make_store(killed, args.steps, kill=True, work=args.work)
    con = sqlite3.connect(run_dir / "run.sqlite")
    n_steps, n_phases, n_samples = (
        con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("steps", "phases", "samples")
    )
    con.close()
    return {
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "loadavg_before": runs["loadavg_before"],
        "loadavg_after": " ".join(Path("/proc/loadavg").read_text().split()[:3]),
        "steps": args.steps,
        "matrix": args.matrix,
        "seconds": {m: runs[m][1]["seconds"] for m in ("bare", "session", "traced")},
        "rows": {"steps": n_steps, "phases": n_phases, "samples": n_samples},
        "checkpoints": {"bare": bare, "session": sess, "traced": traced},
        "lateness_windows": windows,
        "growth_per_10k": {
            "session_rss": per_10k(sess, "rss", args.every),
            "session_rss_beyond_bare": per_10k(sess, "rss_beyond_bare", args.every),
            "bare_rss": per_10k(bare, "rss", args.every),
            "traced_profiler_bytes": per_10k(traced, "traced_profiler_bytes", args.every),
            "store_bytes": per_10k(sess, "store_bytes", args.every),
        },
        "peak_rss": {m: runs[m][1]["peak_rss"] for m in ("bare", "session", "traced")},
        "store_bytes_closed": sess_done["store_bytes_closed"],
        "close_s": sess_done.get("close_s"),
        "store_bytes_per_step": sess_done["store_bytes_closed"] / args.steps,
        "scale": scale(run_dir, tmp, args.repeats, killed),
    }


def show(r: dict[str, Any]) -> None:
    g = r["growth_per_10k"]
    print(f"host {r['host']} ({r['cpus']} CPUs), load average {r['loadavg_before']} before, {r['loadavg_after']} after")
    sec = r["seconds"]
    print(
        f"soak: {r['steps']} steps of a {r['matrix']}x{r['matrix']} matmul; bare {sec['bare']:.0f} s, "
        f"session {sec['session']:.0f} s, traced {sec['traced']:.0f} s; store rows {r['rows']}"
    )
    print(" step   RSS bare  RSS session  beyond bare  stallscope traced   store MB  ticks missed  lateness ms")
    print("                                                                                  mean   p99   max")
    lw = [{"ticks": 0, "mean_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}, *r["lateness_windows"]]
    cps = r["checkpoints"]
    for b, s, t, lat in zip(cps["bare"], cps["session"], cps["traced"], lw, strict=True):
        print(
            f"{s['step']:6d} {b['rss'] / MIB:8.1f} MiB {s['rss'] / MIB:8.1f} MiB {s['rss_beyond_bare'] / MIB:8.1f} MiB"
            f" {t['traced_profiler_bytes'] / MIB:10.2f} MiB {s['store_bytes'] / MIB:14.2f} {s['ticks']:6d}"
            f" {s['missed']:5d} {lat['mean_ms']:6.2f} {lat['p99_ms']:5.2f} {lat['max_ms']:5.1f}"
        )
    print(
        f"growth per 10,000 steps (slope after the first window): session RSS {g['session_rss'] / MIB:+.2f} MiB, "
        f"beyond bare {g['session_rss_beyond_bare'] / MIB:+.2f} MiB, stallscope's traced Python memory "
        f"{g['traced_profiler_bytes'] / MIB:+.2f} MiB, store {g['store_bytes'] / MIB:+.2f} MB"
    )
    print(
        f"store: {r['store_bytes_closed'] / MIB:.1f} MiB closed, {r['store_bytes_per_step']:.0f} bytes/step; "
        f"peak RSS bare {r['peak_rss']['bare'] / MIB:.0f} MiB, session {r['peak_rss']['session'] / MIB:.0f} MiB; "
        f"closing the session (flush, summary from the store, summary.json) {r['close_s']:.2f} s"
    )
    show_scale(r["scale"], f"the {r['steps']}-step store")


def show_scale(sc: dict[str, Any], what: str) -> None:
    facts = f"{sc['completed_store']['steps']} steps"
    if "killed_store" in sc:
        facts += f"; the killed store: {sc['killed_store']['steps']} steps, status {sc['killed_store']['status']}"
        facts += "" if sc.get("left_cached") else ", its sampler process wrote no cache"
        facts += "" if sc["second_read_cached"] else ", its first read wrote no cache"
    print(f"commands on {what} ({facts}; fresh interpreter each; target < {TARGET_S:g} s, < {TARGET_MIB:g} MiB;")
    print(f"  load average after: {sc['loadavg']}):")
    states = [st for st in STATES if st in sc]
    print(f"  {'command':22s}" + "".join(f"  {st:>31s}" for st in states))
    for name in COMMANDS:
        cells = []
        for st in states:
            c = sc[st][name]
            ok = c["seconds"] < TARGET_S and c["peak_rss"] / MIB < TARGET_MIB and c["rc"] == 0
            verdict = "ok" if ok else "MISSED"
            cells.append(f"{c['seconds']:5.2f} s {c['cpu_seconds']:4.2f} CPU {c['peak_rss'] / MIB:3.0f} MiB {verdict}")
        print(f"  {name:22s}" + "".join(f"  {cell:>31s}" for cell in cells))
    print(
        f"  trace: {sc['trace_events']} events, {sc['trace_bytes'] / 1e6:.2f} MB; "
        f"HTML {sc['html_bytes'] / 1e3:.0f} kB; "
        f"interpreter + command line {sc['startup']['seconds']:.2f} s; report imports torch: "
        f"{sc['report_imports']['torch']}, numpy: {sc['report_imports']['numpy']}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--every", type=int, default=10_000)
    ap.add_argument("--matrix", type=int, default=320, help="side of the square matmul each step computes")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each command (median time, largest peak)")
    ap.add_argument("--keep", metavar="DIR", help="keep the stores and outputs in DIR")
    ap.add_argument("--reuse", action="store_true", help="with --keep: reuse the runs already complete in DIR")
    ap.add_argument(
        "--scale-only",
        metavar="RUN_DIR",
        nargs="?",
        const="",
        help="only time the commands: on RUN_DIR (else on a store of --steps fast steps) and on a killed store",
    )
    ap.add_argument("--killed", metavar="DIR", help="with --scale-only: the killed store to time (else one is made)")
    ap.add_argument("--work", type=int, default=1500, help="--scale-only's stores: sum(range(WORK)) a step")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", choices=("bare", "session", "traced"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.steps, args.every, args.matrix, Path(args.out))
        return 0
    if args.scale_only is not None:
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(args.keep) if args.keep else Path(d)
            tmp.mkdir(parents=True, exist_ok=True)
            run = Path(args.scale_only) if args.scale_only else tmp / "completed"
            if not args.scale_only:
                make_store(run, args.steps, kill=False, work=args.work)
            killed = Path(args.killed) if args.killed else tmp / "killed-store"
            if not args.killed:
                make_store(killed, args.steps, kill=True, work=args.work)
            got = scale(run, tmp, args.repeats, killed)
        print(json.dumps(got, indent=2) if args.json else "")
        if not args.json:
            show_scale(got, str(run))
        return 0
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="stallscope-soak-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        runs: dict[str, Any] = {"loadavg_before": " ".join(Path("/proc/loadavg").read_text().split()[:3])}
        # the session alone (its sampler's lateness is a figure); the two runs whose timing is not used side by side
        runs["session"] = finish_soak("session", start_soak("session", args, tmp), tmp)
        started = {mode: start_soak(mode, args, tmp) for mode in ("bare", "traced")}
        for mode, proc in started.items():
            runs[mode] = finish_soak(mode, proc, tmp)
        result = summarise(args, runs, tmp / "session", tmp)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
