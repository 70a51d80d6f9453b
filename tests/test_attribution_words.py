"""A run whose py-spy sampled none of its loader workers says so in words (issue #65: a 40-step run beside a 2-rank job
had ``loader_attribution: null`` and the report's section was simply missing)."""

from __future__ import annotations

import io

from rich.console import Console
from test_sampled import FORWARD, NEXT, WORKER, record, speedscope

from profiler.analysis import summarize
from profiler.analysis.attribution import unattributed_workers
from profiler.render.report import render_report

SAID = "has no sample of the loader's 2 worker processes: no loader attribution"


def _report(meta: dict[str, object], threads: dict) -> tuple[object, str]:
    s = summarize(record(speedscope(threads), target_pid=1, workers=2, **meta))
    out = io.StringIO()
    render_report(s, Console(file=out, width=400, color_system=None))
    return s, out.getvalue()


def test_a_run_whose_pyspy_sampled_no_worker_says_so_in_the_report() -> None:
    main_only = {((1,), "1"): [FORWARD] * 20 + [NEXT] * 20}
    s, text = _report({}, main_only)
    assert s.loader_attribution is None  # type: ignore[attr-defined]
    assert sum(SAID in n for n in s.notes) == 1, s.notes  # type: ignore[attr-defined]
    assert SAID in text and "py-spy (100 Hz)" in text, text
    # the same run with its workers sampled: their attribution, and no such words
    with_workers = {**main_only, ((1, 2), "2"): [WORKER] * 30, ((1, 3), "3"): [WORKER] * 30}
    s, text = _report({}, with_workers)
    assert s.loader_attribution is not None and s.loader_attribution.workers == 2  # type: ignore[attr-defined]
    assert SAID not in text and not any("no loader attribution" in n for n in s.notes), s.notes  # type: ignore[attr-defined]


def test_only_a_pyspy_that_ran_on_a_run_with_worker_processes_is_said_to_have_missed_them() -> None:
    assert unattributed_workers({"pyspy_rate": 50, "workers": 1}, False) == (
        "py-spy (50 Hz) has no sample of the loader's 1 worker process: no loader attribution. It samples a worker "
        "only once it has found and attached to it, measured 0.6-2.8 s after the workers started on a busy 2-core "
        "host: workers that live shorter than that (a short run, or one beside other jobs) end unsampled; a longer "
        "run gives it time"
    )
    assert unattributed_workers({"pyspy_rate": 50, "workers": 2}, True) is None  # attributed
    assert unattributed_workers({"workers": 2}, False) is None  # no py-spy (--no-attribution)
    assert unattributed_workers({"pyspy_rate": 50, "workers": 0}, False) is None  # no workers
    # DALI's workers are threads: no worker process for py-spy to sample
    assert unattributed_workers({"pyspy_rate": 50, "workers": 2, "loader": {"worker_processes": 0}}, False) is None
    # a py-spy that failed is said by its own note
    assert unattributed_workers({"pyspy_rate": 50, "workers": 2, "pyspy_problem": "cannot attach"}, False) is None
