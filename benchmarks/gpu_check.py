"""``make gpu-check``: check the CUDA paths on a machine with a real NVIDIA GPU, and the simulated twin beside them.

Steps, in order:

1. Without CUDA (``torch.cuda.is_available()`` False) print one line and exit 3, before anything else runs.
2. The gpu-marked tests: ``python -m pytest -q -m gpu`` in a subprocess. Any exit other than 0 fails the check,
   exit 5 (no tests collected) included: the gpu tests were not found, so nothing was checked.
3. A short ``stallscope run`` of every built-in scenario x every pipeline that can train it here
   (``pipelines.applicable``), once on ``--device cuda`` and once on ``--device sim:<twin>``, the simulated
   accelerator nearest to this GPU. Each run's ``summary.json`` is judged (:func:`judge`):
   CUDA: the NVML source available with a utilisation figure over the measured window, the device busy fraction
   from the kernels of a kernel window (``--kernel-windows 0:STEPS+1``: every measured step) in (0, 1], the
   CUDA-event span (``device_span_fraction``) in (0, 1], and for ``naive`` (pageable memory, a blocking copy)
   h2d > 0 ms/step; sim: exit 0 and ``device.kind == "sim"``.
4. The kernel case (issue #45): ``ssd`` with 0 workers, ``naive`` and ``prefetch``, KERNEL_STEPS steps at the
   sampler's 100 Hz, on CUDA. Each run's kernel busy fraction must be within KERNEL_POINTS of NVML's
   ``utilization.gpu`` over the same steps (the windows cover them all), ``prefetch`` must be named
   ``host-bound`` (its loader thread holds the GIL while the training thread launches) and ``naive`` input-bound.

NVML's ``utilization.gpu`` is sampled (here at 100 Hz, the sampler's maximum): a 3-step run of a small model on a
fast GPU can measure for less than one sample period, so no sample falls in its window. Such a CUDA run is run
once more with enough steps for about ``MIN_WINDOW_S`` of measurement, and the table says so.

Exit codes: 0 every cell and the gpu tests passed; 1 any failed (the run directories are kept and named);
2 an unknown ``--scenarios`` name; 3 no CUDA device here.

Run: ``.venv/bin/python benchmarks/gpu_check.py [--steps 3] [--warmup 1] [--scenarios a,b] [--skip-tests]``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_NO_CUDA = 0, 1, 2, 3
NO_CUDA = "gpu-check: no CUDA device here (torch.cuda.is_available() is False); run it on a machine with an NVIDIA GPU"
PYTEST_NO_TESTS = 5  # pytest's exit code when nothing was collected
DEFAULT_TWIN = "h100"
# the sampler's maximum (profiler.core.sampling.sampler.MAX_HZ): the most NVML samples a short run can get
SAMPLE_HZ = 100.0
MIN_WINDOW_S = 0.5  # measured time a CUDA run is lengthened to when its first run caught no NVML sample
MAX_STEPS = 2000
KERNEL_STEPS = 30  # the kernel case's measured steps (the ssd runs: 30 steps, NVML at 100 Hz)
KERNEL_POINTS = 0.05  # kernel busy against NVML utilisation over the same steps: within 5 points
HOST_BOUND = "host-bound: the GPU waits for the host"


def sim_twin(device_name: str, keys: Sequence[str] | None = None) -> tuple[str, str | None]:
    """The simulated accelerator (a key of ``profiler.sim.specs.ACCELERATORS``) nearest to the CUDA device named
    ``device_name`` (``torch.cuda.get_device_name()``), and a note when none matches (then ``h100``).

    A key matches as a whole token of the name ("NVIDIA A100-SXM4-80GB" -> a100, "Tesla T4" -> t4), so that
    "T4" inside another model number does not.
    """
    from profiler.sim.specs import match_accelerator, unknown_device

    key = match_accelerator(device_name, keys)
    if key is not None:
        return key, None
    return DEFAULT_TWIN, f"{unknown_device(device_name)}: its twin here is sim:{DEFAULT_TWIN}"


def nvml_util(summary: dict[str, Any]) -> float | None:
    """The mean NVML ``utilization.gpu`` (%) over the measured window of the first GPU that has one, or None."""
    nvml = summary.get("nvml") or {}
    for key in sorted(nvml):
        if re.fullmatch(r"gpu\d+_util_pct_mean", key) and _finite(nvml[key]):
            return float(nvml[key])
    return None


def h2d_ms(summary: dict[str, Any]) -> tuple[float | None, str]:
    """The copy's ms per step and where it comes from: the CUDA-event device time when it was recorded, else the
    host-blocked time of the breakdown."""
    device = (summary.get("device_ms_per_step") or {}).get("h2d")
    if _finite(device):
        return float(device), "cuda-events"
    host = (summary.get("breakdown_ms_per_step") or {}).get("h2d")
    return (float(host), "host") if _finite(host) else (None, "none")


def judge(summary: dict[str, Any] | None, *, device: str, pipeline: str, exit_code: int) -> list[str]:
    """Why one run fails the check (empty: it passes). ``device`` is ``cuda`` or ``sim:<name>``, as it was run."""
    reasons: list[str] = []
    if exit_code != 0:
        reasons.append(f"exit code {exit_code}")
    if summary is None:
        return [*reasons, "no summary.json"]
    kind = (summary.get("device") or {}).get("kind")
    status = summary.get("status")
    if status != "complete":
        reasons.append(f"status {status}")
    if device.startswith("sim:"):
        if kind != "sim":
            reasons.append(f'device.kind is {kind!r}, not "sim"')
        return reasons
    if kind != "cuda":
        reasons.append(f'device.kind is {kind!r}, not "cuda"')
    nvml = (summary.get("device") or {}).get("nvml")
    if nvml != "available":
        reasons.append(f"NVML source {nvml or 'not recorded'}")
    elif nvml_util(summary) is None:
        reasons.append(f"no NVML utilisation figure in the measured window ({_window(summary)})")
    busy = summary.get("device_busy_fraction")
    busy_source = str((summary.get("sources") or {}).get("device_busy_fraction", ""))
    if not busy_source.startswith("kernel time (CUPTI"):
        reasons.append(f"device busy fraction not from kernel windows ({busy_source or 'no source recorded'})")
    if not (_finite(busy) and 0.0 < float(busy) <= 1.0 + 1e-9):
        reasons.append(f"device busy fraction {_num(busy, '.3f')} is not in (0, 1]")
    span = summary.get("device_span_fraction")
    if not (_finite(span) and 0.0 < float(span) <= 1.0 + 1e-9):
        reasons.append(f"CUDA-event span fraction {_num(span, '.3f')} is not in (0, 1]")
    if pipeline == "naive":
        ms, source = h2d_ms(summary)
        if ms is None or ms <= 0.0:
            reasons.append(f"naive h2d {_num(ms, '.3f')} ms/step ({source}), expected > 0")
    return reasons


def judge_kernel_case(summary: dict[str, Any] | None, *, pipeline: str) -> list[str]:
    """Why a run of the kernel case fails (see the module): kernel busy against NVML's utilisation over the same
    steps, and the cause named (prefetch: the host; naive: input)."""
    if summary is None:
        return []
    reasons = []
    busy, util = summary.get("device_busy_fraction"), nvml_util(summary)
    if _finite(busy) and util is not None and abs(float(busy) - util / 100.0) > KERNEL_POINTS:
        reasons.append(
            f"kernel busy {float(busy):.3f} is more than {KERNEL_POINTS * 100:.0f} points from NVML utilisation "
            f"{util:.1f}%"
        )
    verdict = str(summary.get("verdict") or "")
    if pipeline == "prefetch" and verdict != HOST_BOUND:
        reasons.append(f"prefetch with 0 workers named {verdict!r}, not {HOST_BOUND!r}")
    if pipeline == "naive" and (not verdict.endswith("input-bound") or verdict == "not input-bound"):
        reasons.append(f"naive with 0 workers named {verdict!r}, not input-bound")
    return reasons


def longer_steps(summary: dict[str, Any] | None, steps: int, min_window_s: float = MIN_WINDOW_S) -> int | None:
    """Measured steps for about ``min_window_s`` of measurement when a run of ``steps`` measured less (None when
    it measured enough, or did not say how long it measured)."""
    measured = (summary or {}).get("measured_s")
    if not _finite(measured) or float(measured) >= min_window_s:
        return None
    per_step = max(float(measured), 1e-6) / steps
    return min(MAX_STEPS, max(steps + 1, math.ceil(min_window_s / per_step)))


@dataclass
class Cell:
    """One run of the check: scenario x pipeline x device, and what was judged of it."""

    scenario: str
    pipeline: str
    device: str
    summary: dict[str, Any] | None = None
    failures: list[str] = field(default_factory=list)
    note: str | None = None
    workers: int = 0
    kernel_case: bool = False  # judged by judge_kernel_case as well

    @property
    def passed(self) -> bool:
        return not self.failures


HEADER = (
    "scenario", "pipeline", "device", "samples/s", "stall %", "busy", "span", "GPU host %", "NVML util", "h2d ms/step",
    "verdict",
)  # fmt: skip


def table(cells: Sequence[Cell]) -> str:
    """The check's table: one line per cell, PASS or FAIL with why last; simulated figures are on sim: rows."""
    rows = [(*HEADER, "result")]
    for c in cells:
        s = c.summary or {}
        util = nvml_util(s) if c.summary is not None else None
        ms, _ = h2d_ms(s)
        result = "PASS" if c.passed else "FAIL: " + "; ".join(c.failures)
        if c.note:
            result += f" ({c.note})"
        rows.append(
            (
                c.scenario,
                c.pipeline,
                c.device,
                _num(s.get("throughput_samples_per_s"), ",.0f"),
                _num(_pct(s.get("stall_fraction")), ".1f"),
                _num(s.get("device_busy_fraction"), ".3f"),
                _num(s.get("device_span_fraction"), ".3f"),
                _num(_pct(((s.get("gpu") or {}).get("fractions") or {}).get("host")), ".1f"),
                "-" if util is None else f"{util:.0f}%",
                _num(ms, ".3f"),
                str(s.get("verdict") or "-"),
                result,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _finite(x: object) -> TypeGuard[float]:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _num(x: object, fmt: str) -> str:
    return format(float(x), fmt) if _finite(x) else "-"


def _pct(x: object) -> float | None:
    return 100.0 * float(x) if _finite(x) else None


def _window(summary: dict[str, Any]) -> str:
    sampler = summary.get("sampler") or {}
    hz = _num(sampler.get("hz_achieved"), ".0f")
    return f"measured {_num(summary.get('measured_s'), '.3f')} s, sampler at {hz} Hz"


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def run_tests(timeout_s: float) -> str | None:
    """The gpu-marked tests, their output on this terminal; why they failed, or None when they passed."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "gpu"]
    print(f"gpu-check: running python {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    try:
        code = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s, check=False).returncode
    except subprocess.TimeoutExpired:
        return f"pytest -m gpu ran past {timeout_s:.0f} s"
    if code == PYTEST_NO_TESTS:
        return "pytest -m gpu collected no tests (exit 5): the gpu-marked tests were not found, nothing was checked"
    return f"pytest -m gpu failed (exit {code})" if code else None


def run_cell(cell: Cell, out: Path, args: argparse.Namespace, steps: int) -> tuple[int, str]:
    """``stallscope run`` of one cell into ``out`` (one kernel window over every measured step); its exit code and
    the last line of its stderr."""
    cmd = [
        sys.executable, "-m", "profiler", "run", cell.scenario, "--pipeline", cell.pipeline,
        "--device", cell.device, "--steps", str(steps), "--warmup", str(args.warmup), "--workers", str(cell.workers),
        "--kernel-windows", f"0:{steps + 1}", "--sample-hz", f"{SAMPLE_HZ:g}", "--no-live", "--json", "--out", str(out),
    ]  # fmt: skip
    try:
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout, check=False)
    except subprocess.TimeoutExpired:
        return -1, f"ran past {args.timeout:.0f} s"
    return res.returncode, _last_line(res.stderr)


def read_summary(out: Path) -> dict[str, Any] | None:
    try:
        doc = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def check_cell(cell: Cell, out: Path, args: argparse.Namespace) -> None:
    """Run and judge one cell; a CUDA run that caught no NVML sample in a too-short window runs once longer."""
    code, err = run_cell(cell, out, args, KERNEL_STEPS if cell.kernel_case else args.steps)
    cell.summary = read_summary(out)
    cell.failures = judge(cell.summary, device=cell.device, pipeline=cell.pipeline, exit_code=code)
    more = longer_steps(cell.summary, args.steps) if cell.device == "cuda" else None
    if more is not None and any(f.startswith("no NVML utilisation") for f in cell.failures):
        first = _window(cell.summary or {})
        longer = out.with_name(out.name + f"-steps{more}")
        code, err = run_cell(cell, longer, args, more)
        cell.summary = read_summary(longer)
        cell.failures = judge(cell.summary, device=cell.device, pipeline=cell.pipeline, exit_code=code)
        cell.note = f"run again with --steps {more}: {args.steps} steps {first}, too short for an NVML sample"
    if cell.kernel_case:
        cell.failures += judge_kernel_case(cell.summary, pipeline=cell.pipeline)
    if code != 0 and err:
        cell.failures.append(err)


def plan(only: Sequence[str] | None) -> tuple[list[tuple[str, str]], list[str]]:
    """(scenario, pipeline) pairs to run, and one line per pair left out with why."""
    import pipelines
    import scenarios

    pairs: list[tuple[str, str]] = []
    left_out: list[str] = []
    for name in only or scenarios.names():
        usable, why = pipelines.applicable(scenarios.get(name).data)
        pairs += [(name, p) for p in usable]
        left_out += [f"{name} / {p}: {reason}" for p, reason in why.items()]
    return pairs, left_out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="measured steps per run (default 3)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per run (default 1)")
    ap.add_argument("--scenarios", help="comma-separated built-in scenarios (default: all)")
    ap.add_argument("--skip-tests", action="store_true", help="do not run pytest -m gpu first")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one run (or the tests) may take")
    ap.add_argument("--out", help="directory for the run directories (default: a new temporary one)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(NO_CUDA)
        return EXIT_NO_CUDA
    gpu = torch.cuda.get_device_name(0)
    twin, twin_note = sim_twin(gpu)
    print(f"gpu-check: {gpu} (simulated twin sim:{twin})", file=sys.stderr, flush=True)
    if twin_note:
        print(f"gpu-check: note: {twin_note}", file=sys.stderr, flush=True)

    try:
        pairs, left_out = plan(args.scenarios.split(",") if args.scenarios else None)
    except ValueError as exc:  # ScenarioError: an unknown --scenarios name, one line naming the allowed ones
        print(f"gpu-check: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    test_failure = None if args.skip_tests else run_tests(args.timeout)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="stallscope-gpu-check-"))
    root.mkdir(parents=True, exist_ok=True)
    cells = [Cell(s, p, d) for s, p in pairs for d in ("cuda", f"sim:{twin}")]
    if not args.scenarios or "ssd" in args.scenarios.split(","):
        cells += [Cell("ssd", p, "cuda", kernel_case=True) for p in ("naive", "prefetch")]
    for i, cell in enumerate(cells, 1):
        t0 = time.monotonic()
        name = f"{cell.scenario}-{cell.pipeline}-{cell.device.replace(':', '-')}" + (
            "-kernels" if cell.kernel_case else ""
        )
        check_cell(cell, root / name, args)
        verdict = "PASS" if cell.passed else "FAIL"
        print(
            f"gpu-check: [{i}/{len(cells)}] {cell.scenario} {cell.pipeline} {cell.device}: {verdict} "
            f"({time.monotonic() - t0:.0f} s)",
            file=sys.stderr,
            flush=True,
        )

    print(table(cells))
    for line in left_out:
        print(f"not applicable: {line}")
    if args.skip_tests:
        print("gpu tests: skipped (--skip-tests)")
    else:
        print(f"gpu tests: {'FAIL: ' + test_failure if test_failure else 'PASS'}")
    failed = sum(not c.passed for c in cells)
    if failed or test_failure:
        print(f"gpu-check: FAIL: {failed} of {len(cells)} runs failed; run directories kept in {root}")
        return EXIT_FAILED
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)
    print(f"gpu-check: PASS: {len(cells)} runs on {gpu} and sim:{twin}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
