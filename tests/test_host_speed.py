"""benchmarks/host_speed.py's arithmetic on pieces of known times (the benchmark itself only times; docs/benchmarks.md
gives its figures), and its bad input."""

from __future__ import annotations

import importlib.util
import statistics
import sys
from types import ModuleType

import pytest
from conftest import ROOT


def host_speed() -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:  # its shared helpers (pairing.py), as when run as a script
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("host_speed", ROOT / "benchmarks" / "host_speed.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_windows_are_the_mean_piece_of_each_whole_window() -> None:
    hs = host_speed()
    # 10 ms pieces for 2 s, then 20 ms pieces for 2 s, then a last window cut short at 4.5 s
    pieces = [(i * 0.01, 0.01) for i in range(200)] + [(2.0 + i * 0.02, 0.02) for i in range(125)]
    assert hs.windows(pieces, 1.0) == pytest.approx([0.01, 0.01, 0.02, 0.02])  # 4.x s: the fifth is cut short
    assert hs.windows(pieces, 2.0) == pytest.approx([0.01, 0.02])
    got = hs.variation([1.0, 2.0, 3.0, 4.0])
    assert (got["median"], got["min"], got["max"], got["max_over_min"]) == (2.5, 1.0, 4.0, 4.0)
    assert got["cv"] == pytest.approx(statistics.stdev([1, 2, 3, 4]) / 2.5)


def test_too_short_for_three_windows_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert host_speed().main(["--seconds", "20", "--window", "10"]) == 2
    err = capsys.readouterr().err
    assert err == "--seconds 20 must hold three --window 10 (at least 1 s)\n"
