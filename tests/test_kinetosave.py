"""Kineto's trace export with the GIL released (profiler.core.kinetosave): the same trace as torch's binding writes,
the GIL free while kineto writes it (where torch's binding holds it for the whole export), and torch's binding
wherever a check of the module fails.

Truth from the same run and clock: a thread that reads the clock in a loop while the export runs on another thread;
its longest gap is how long the GIL was held. Through torch's binding that gap spans the export; through the module
it is a small part of it. Run with torch's CPU operators (the same ``_ProfilerResult`` a CUDA window gives).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest

from profiler.core import kinetosave
from profiler.core.kernelwin import TorchKernelRecorder

torch = pytest.importorskip("torch")
LIB = os.path.join(os.path.dirname(torch.__file__), "lib")


def window(ops: int) -> object:
    """A CPU profile of ``ops`` in-place adds (two events each: the operator and its kernel), stopped."""
    x = torch.ones(4)
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    prof.start()
    for _ in range(ops):
        x.add_(1)
    prof.stop()
    return prof.profiler.kineto_results


def names(path: Path) -> Counter[str]:
    return Counter(e.get("name", "") for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X")


def test_the_native_export_writes_the_trace_torchs_binding_writes(tmp_path: Path, monkeypatch) -> None:
    how, held = kinetosave.save(window(500), str(tmp_path / "native.json"), LIB)
    assert how == "native"
    assert held < 0.05  # the checks only (the call itself released the GIL)
    monkeypatch.setenv(kinetosave.ENV, "binding")
    assert kinetosave.save(window(500), str(tmp_path / "binding.json"), LIB)[0] == "binding"
    native, binding = names(tmp_path / "native.json"), names(tmp_path / "binding.json")
    assert native["aten::add_"] == binding["aten::add_"] == 500
    assert native == binding


def longest_gap_during(export) -> tuple[float, float]:
    """(the export's wall time here, the longest gap between another thread's clock readings while it ran)."""
    spinning, done = threading.Event(), threading.Event()
    gaps: list[float] = []

    def spin() -> None:
        last, gap = time.perf_counter(), 0.0
        spinning.set()
        while not done.is_set():
            now = time.perf_counter()
            gap, last = max(gap, now - last), now
        gaps.append(gap)

    thread = threading.Thread(target=spin)
    thread.start()
    spinning.wait()
    t0 = time.perf_counter()
    export()
    wall = time.perf_counter() - t0
    done.set()
    thread.join()
    return wall, gaps[0]


def test_the_gil_is_free_while_kineto_writes_the_trace(tmp_path: Path, monkeypatch) -> None:
    """torch's binding holds the GIL for the whole export; the module's call lets another thread run through it."""
    results = window(12_000)
    wall, gap = longest_gap_during(lambda: kinetosave.save(results, str(tmp_path / "n.json"), LIB))
    monkeypatch.setenv(kinetosave.ENV, "binding")
    results = window(12_000)
    wall_b, gap_b = longest_gap_during(lambda: kinetosave.save(results, str(tmp_path / "b.json"), LIB))
    assert wall > 0.03 and wall_b > 0.03, (wall, wall_b)  # the export is long enough to see a gap in
    assert gap_b >= 0.8 * wall_b, (gap_b, wall_b)  # the binding: no other thread ran while it wrote
    assert gap < 0.5 * wall, (gap, wall)


def test_a_trace_saved_already_or_a_foreign_object_goes_through_torchs_binding(tmp_path: Path) -> None:
    results = window(50)
    assert kinetosave.at_result(results) != 0
    assert kinetosave.save(results, str(tmp_path / "a.json"), LIB)[0] == "native"
    with pytest.raises(RuntimeError, match="already saved"):  # torch's own error, never a C++ abort
        kinetosave.save(results, str(tmp_path / "b.json"), LIB)
    wrote: list[str] = []
    fake = SimpleNamespace(save=wrote.append, trace_start_ns=lambda: 1)
    assert kinetosave.save(fake, "x.json", LIB)[0] == "binding"
    assert wrote == ["x.json"]
    # torch's library not loaded from that folder: the binding
    assert kinetosave.save(window(50), str(tmp_path / "c.json"), str(tmp_path))[0] == "binding"
    assert (tmp_path / "c.json").exists()


def test_the_runs_recorder_and_the_start_up_module_export_natively(tmp_path: Path) -> None:
    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cpu")
    rec.start()
    x = torch.ones(4)
    for _ in range(3000):
        x.add_(1)
    rec.stop_to(tmp_path / "w.json")
    assert rec.parts["native"] == 1.0
    assert rec.parts["read"] < rec.parts["export"]  # the export's time is not counted as held
    assert names(tmp_path / "w.json")["aten::add_"] == 3000

    from profiler.zerocode.boot.stallscope_instrument import export_trace  # loads kinetosave by its path

    held = export_trace(window(3000), str(tmp_path / "boot.json"))
    assert held < 0.05
    assert names(tmp_path / "boot.json")["aten::add_"] == 3000


@pytest.mark.gpu
def test_a_cuda_windows_trace_is_exported_on_its_thread_with_the_gil_released(tmp_path: Path) -> None:
    """CUDA's path in a run: the window thread stops CUPTI and exports natively while this thread goes on."""
    from profiler.core.kernelwin import WindowThread

    rec = TorchKernelRecorder(torch, time.perf_counter, activity="cuda")
    torch.cuda.init()
    assert rec.usable() is None
    thread = WindowThread(rec, time.perf_counter)
    thread.start()
    for _ in range(3000):
        torch.cuda._sleep(1000)
    boundary = rec.mark()

    def stop() -> None:
        thread.stop(boundary, tmp_path / "w.json")
        assert thread.done.wait(120)

    _, gap = longest_gap_during(stop)
    thread.close()
    assert not isinstance(thread.result, BaseException), thread.result
    assert rec.parts["native"] == 1.0
    kernels = [e for e in json.loads((tmp_path / "w.json").read_text())["traceEvents"] if e.get("cat") == "kernel"]
    assert len(kernels) >= 3000
    if rec.parts["export"] > 0.05:
        assert gap < 0.5 * rec.parts["export"], (gap, rec.parts)


def test_the_module_imports_only_the_standard_library() -> None:
    """The start-up module of ``run --`` loads it by its path in the script's own environment (no stallscope)."""
    import ast
    import sys

    tree = ast.parse(Path(kinetosave.__file__).read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert {m.split(".")[0] for m in names} <= set(sys.stdlib_module_names) | {"__future__"}, names
