"""Loader memory, piece by piece: the source's readings from fake process figures (once a second, a process
that cannot be read left out), the growth rule on readings made by hand, and the report's table. The figures
against the workers' own smaps are in tests/test_memory_truth.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from rich.console import Console

from profiler.analysis.memory import GROWTH_MIN_MB, loader_memory, slope
from profiler.core.sources.memory import MemorySource
from profiler.render.loader import memory_table


@dataclass
class Info:
    uss: int
    pss: int
    rss: int


def test_the_source_reads_every_second_and_leaves_out_what_it_cannot_read(tmp_path) -> None:
    now = [0.0]
    mib = 2**20

    def read(pid: int) -> Info:
        if pid == 3:
            raise ProcessLookupError(pid)
        return Info(uss=10 * mib * pid, pss=20 * mib * pid, rss=50 * mib * pid)

    src = MemorySource(lambda: {"main": 1, "w0": 2, "w1": 3}, clock=lambda: now[0], read=read, shm=str(tmp_path))
    assert src.open() is None
    got = src.read()
    assert got["mem.main.uss_mb"] == 10 and got["mem.w0.pss_mb"] == 40 and got["mem.w0.shared_mb"] == 80
    assert "mem.w1.uss_mb" not in got and got["mem.total.pss_mb"] == 60  # main 20 + w0 40
    assert got["mem.shm.size_mb"] > 0 and got["mem.host.available_mb"] > 0
    now[0] = 0.5
    assert src.read() == {}  # not a second yet
    now[0] = 1.0
    assert "mem.main.uss_mb" in src.read()


def test_the_source_keeps_its_reading_cost_to_its_budget() -> None:
    now = [0.0]

    def slow(pid: int) -> Info:
        now[0] += 0.01  # each process takes 10 ms to read
        return Info(uss=1, pss=1, rss=1)

    src = MemorySource(lambda: {"main": 1, "w0": 2}, clock=lambda: now[0], read=slow, budget=0.005)
    assert src.read() and now[0] == pytest.approx(0.02)
    now[0] = 3.9
    assert src.read() == {}  # 20 ms spent is 0.5% of 4 s: the next reading is due at 4 s
    now[0] = 4.0
    assert src.read()


def test_slope_and_its_fit() -> None:
    b, r2 = slope([(0, 1.0), (1, 3.0), (2, 5.0)])
    assert b == pytest.approx(2.0) and r2 == pytest.approx(1.0)
    assert all(math.isnan(v) for v in slope([(0, 1.0)]))


def _samples(w0: list[float], w1: list[float]) -> list[tuple[float, str, str, float | None]]:
    out: list[tuple[float, str, str, float | None]] = []
    for i, (a, b) in enumerate(zip(w0, w1, strict=True)):
        t = float(i)
        out += [(t, "memory", "mem.main.uss_mb", 200.0), (t, "memory", "mem.w0.uss_mb", a)]
        out += [(t, "memory", "mem.w1.uss_mb", b), (t, "memory", "mem.total.pss_mb", 400.0 + a + b)]
        out += [(t, "memory", "mem.host.available_mb", 1000.0)]
    return out


def test_a_steady_growth_is_named_with_its_rate_and_when_memory_runs_out() -> None:
    # w0 grows 4 MiB a second for 6 s, w1 stays; 100 samples/s over 2 workers: 50 items a second each
    mem = loader_memory(_samples([20 + 4 * i for i in range(7)], [20.0] * 7), None, 100.0, 2)
    assert mem is not None and mem.growing == ("w0",)
    w0 = mem.processes[1]
    assert w0.growth_mb_per_s == pytest.approx(4.0) and w0.growth_mb_per_1k_items == pytest.approx(80.0)
    assert mem.out_of_memory_in_s == pytest.approx(250.0)  # 1,000 MiB available / 4 MiB/s
    assert mem.headline is not None and "w0" in mem.headline and "80.0 MiB per 1,000 items" in mem.headline
    assert mem.total_pss_peak_mb == pytest.approx(400 + 44 + 20)


@pytest.mark.parametrize(
    "w0",
    [
        [20.0 + (GROWTH_MIN_MB / 2) * i / 6 for i in range(7)],  # steady but less than GROWTH_MIN_MB in all
        [20.0, 60.0, 20.0, 60.0, 20.0, 60.0, 21.0],  # large swings, no steady growth
        [20.0, 60.0, 60.0],  # too few readings
    ],
)
def test_what_is_not_growth(w0: list[float]) -> None:
    mem = loader_memory(_samples(w0, [20.0] * len(w0)), None, 100.0, 2)
    assert mem is not None and mem.growing == () and mem.headline is None and math.isnan(mem.out_of_memory_in_s)


def test_no_memory_readings_no_figures_and_the_table() -> None:
    assert loader_memory([(0.0, "host", "proc.main.rss_mb", 10.0)], None, 10.0, 2) is None
    mem = loader_memory(_samples([20 + 4 * i for i in range(7)], [20.0] * 7), (0.0, 6.0), 100.0, 2)
    assert mem is not None
    console = Console(record=True, width=120)
    console.print(memory_table(mem))
    text = console.export_text()
    assert "80.0 grows" in text and "copy-on-read" in text and "sum of PSS" in text, text
