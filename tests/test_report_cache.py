"""The report cache (profiler/runs/cache.py): a closed run's Summary and Timeline as built at close, read back
exactly, and read only when it is the store's own; ``report``, ``--html`` and ``--json`` give the same output
from it as from the rows."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from conftest import sleep_loader

from profiler import Session
from profiler.analysis import Summary, summarize
from profiler.analysis.codec import CodecError, allowed, decode, encode
from profiler.analysis.timeline import build_timeline
from profiler.cli import main
from profiler.core.store import load_run
from profiler.runs import cache
from profiler.runs.cache import CACHE_NAME, read_cache


@pytest.fixture(scope="module")
def closed_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("cache") / "run"
    with Session(run, sample_hz=20, warmup=2, meta={"scenario": "cached", "batch_size": 4}) as s:
        for _ in s.wrap(sleep_loader(40, 0.004)):
            with s.phase("h2d"):
                pass
            with s.phase("compute"):
                time.sleep(0.003)
    return run


def test_the_cache_written_at_close_reads_back_what_the_rows_give(closed_run: Path) -> None:
    assert (closed_run / CACHE_NAME).is_file()
    got = read_cache(closed_run)
    assert got is not None
    summary, timeline = got
    rec = load_run(closed_run)
    want = summarize(rec)
    assert repr(summary) == repr(want)  # every field, NaN included (a NaN is not == itself)
    assert json.dumps(summary.to_dict(), sort_keys=True) == json.dumps(want.to_dict(), sort_keys=True)
    assert repr(timeline) == repr(build_timeline(rec))  # its record (not in the repr) is not kept
    assert summary.steps == 38 and len(timeline.bars) == 40


def test_the_codec_makes_only_the_classes_a_summary_holds() -> None:
    classes = allowed(Summary)
    assert "Summary" in classes and "Recommendation" in classes
    with pytest.raises(CodecError, match="'Popen'"):
        decode({"__t": "Popen", "args": ["rm"]}, classes)
    with pytest.raises(CodecError, match="differ"):
        decode({"__t": "Recommendation", "code": "X"}, classes)
    odd = {(1, "a"): (float("nan"), [1, {"__x": 2}])}
    back = decode(json.loads(json.dumps(encode(odd))), classes)
    assert list(back) == [(1, "a")] and back[(1, "a")][1] == [1, {"__x": 2}]


def _report(run: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(run), *args]) == 0
    return capsys.readouterr().out


def test_report_from_the_cache_is_the_report_from_the_rows(
    closed_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = cache.decode
    monkeypatch.setattr(cache, "decode", lambda doc, classes: calls.append("cache") or real(doc, classes))
    cached = [_report(closed_run, "--json", capsys=capsys), _report(closed_run, capsys=capsys)]
    _report(closed_run, "--html", str(tmp_path / "cached.html"), capsys=capsys)
    assert calls  # the cache was read
    monkeypatch.setattr(cache, "fingerprint", lambda: "other code")  # today's analysis differs: the rows are read
    calls.clear()
    rows = [_report(closed_run, "--json", capsys=capsys), _report(closed_run, capsys=capsys)]
    _report(closed_run, "--html", str(tmp_path / "rows.html"), capsys=capsys)
    assert not calls
    assert cached == rows
    assert (tmp_path / "cached.html").read_text() == (tmp_path / "rows.html").read_text()


def test_the_cache_is_read_only_when_it_is_the_stores_own(closed_run: Path, tmp_path: Path) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(closed_run, run)
    os.utime(run / CACHE_NAME)  # a copy keeps the order of the two files' times
    assert read_cache(run) is not None
    doc = json.loads((run / CACHE_NAME).read_text())
    for key, other in (("steps", 39), ("run_id", "another"), ("status", "failed"), ("code", "0" * 16)):
        (run / CACHE_NAME).write_text(json.dumps({**doc, key: other}))
        assert read_cache(run) is None, key
    (run / CACHE_NAME).write_text(json.dumps(doc))
    assert read_cache(run) is not None
    past = (run / "run.sqlite").stat().st_mtime - 10
    os.utime(run / CACHE_NAME, (past, past))  # older than the store: written before its last rows
    assert read_cache(run) is None
    os.utime(run / CACHE_NAME)
    (run / CACHE_NAME).write_text("{not json")
    assert read_cache(run) is None
