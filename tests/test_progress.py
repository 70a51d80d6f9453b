"""The plain-line progress that ``stallscope`` prints off a terminal while it generates a data set."""

from __future__ import annotations

import io

from profiler.render.progress import progress


def test_plain_progress_prints_every_tenth_and_the_last_line_once() -> None:
    out = io.StringIO()
    with progress("gen", stream=out) as report:
        for done in (0, 3, 5, 9, 10, 10):
            report(done, 10)
    lines = out.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["gen: 0/10", "gen: 3/10", "gen: 5/10", "gen: 9/10", "gen: 10/10"]
    assert lines[-1].startswith("gen: 10/10 (100%, ")


def test_plain_progress_of_nothing_prints_one_line() -> None:
    out = io.StringIO()
    with progress("gen", stream=out) as report:
        report(0, 0)
        report(0, 0)
    assert out.getvalue().splitlines()[0].startswith("gen: 0/0 (100%") and out.getvalue().count("\n") == 1
