"""`stallscope data make`: writes a set, is a no-op on a complete one, and refuses bad input with exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from profiler.core.store import load_run
from scenarios.datagen import MARKER, make
from tests.conftest import ROOT, stallscope, wait_until


def test_data_make_writes_then_is_a_no_op(tmp_path: Path) -> None:
    out = tmp_path / "set"
    r = stallscope("data", "make", "imagenet-like", "--out", str(out), "--count", "6", "--classes", "2")
    assert r.returncode == 0, r.stderr
    assert "wrote 6 imagenet-like images" in r.stdout
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["class_000", "class_001"]
    assert "6/6 (100%" in r.stderr  # the plain progress line off a TTY
    mtimes = {p: p.stat().st_mtime_ns for p in out.rglob("*.jpg")}
    again = stallscope("data", "make", "imagenet-like", "--out", str(out), "--count", "6", "--classes", "2")
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*.jpg")} == mtimes


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["imagenet", "--count", "3"], "unknown data kind 'imagenet'"),
        (["imagenet-like", "--count", "0"], "out of range"),
        (["imagenet-like", "--count", "3", "--classes", "5"], "classes"),
    ],
)
def test_data_make_bad_input_exits_2(tmp_path: Path, args: list[str], needle: str) -> None:
    r = stallscope("data", "make", args[0], "--out", str(tmp_path / "o"), *args[1:])
    assert r.returncode == 2 and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_data_make_refuses_a_set_made_with_other_parameters(tmp_path: Path) -> None:
    out = tmp_path / "set"
    assert stallscope("data", "make", "voc-like", "--out", str(out), "--count", "3").returncode == 0
    assert (out / "annotations.json").exists()
    r = stallscope("data", "make", "voc-like", "--out", str(out), "--count", "4")
    assert r.returncode == 2 and "use another --out" in r.stderr


def test_data_make_killed_part_way_resumes_without_redoing_work(tmp_path: Path) -> None:
    """``kill -9`` of ``data make`` (the parent alone, as the out-of-memory killer does): its workers exit too,
    only whole images are left under image names, and the same command again generates just the missing ones
    and says it resumed; the set then equals a fresh one."""
    out = tmp_path / "set"
    args = ["data", "make", "imagenet-like", "--out", str(out), "--count", "60", "--classes", "3", "--jobs", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    quiet = subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "profiler", *args], cwd=ROOT, env=env, stdout=quiet, stderr=quiet, start_new_session=True
    )

    def group_alive() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return False
        return True

    try:
        assert wait_until(lambda: len(list(out.rglob("*.jpg"))) >= 10, timeout=120)
        proc.kill()
        proc.wait(timeout=10)
        assert wait_until(lambda: not group_alive(), timeout=10)  # no orphaned worker left writing
    finally:
        if group_alive():
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (out / MARKER).exists() and (out / "stallscope-data.partial.json").exists()
    kept = {p: p.stat().st_mtime_ns for p in out.rglob("*.jpg")}
    assert 0 < len(kept) < 60
    for p in kept:  # an image name only ever holds a whole image
        with Image.open(p) as img:
            img.load()

    again = stallscope(*args)
    assert again.returncode == 0, again.stderr
    missing = 60 - len(kept)
    assert f"resumed {out}: wrote the {missing} missing imagenet-like images ({len(kept)} were already" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished work is not redone
    assert (out / MARKER).exists() and not list(out.rglob("*.tmp")) and not list(out.rglob(".*"))
    ref = make("imagenet-like", tmp_path / "ref", 6, classes=3, jobs=1)  # image i depends on (seed, i, label) only
    for name in (p.relative_to(ref.root) for p in ref.root.rglob("*.jpg")):
        assert (out / name).read_bytes() == (ref.root / name).read_bytes()
    assert len(list(out.rglob("*.jpg"))) == 60


def test_synthetic_input_keeps_no_data_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # issue #57: `run imagenet --synthetic-input` generated the 1,280-image imagenet-like set (21 s on a new machine)
    # and then trained on its loader's first batch alone. Now one batch is rendered into a temporary directory,
    # removed at exit; whatif renders the same batch again where it needs a sample
    monkeypatch.setenv("STALLSCOPE_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    res = stallscope(
        "run", "imagenet", "--synthetic-input", "--device", "sim:v100", "--steps", "3", "--warmup", "1",
        "--batch-size", "12", "--no-live", "--json", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout)["steps"] == 3
    assert not (tmp_path / "data").exists()  # no data set kept
    left = [p.name for p in (tmp_path / "tmp").iterdir() if p.name.startswith("stallscope-")]
    assert left == []  # the batch's directory went at exit (torch's own caches may stay)
    meta = load_run(tmp_path / "run").meta
    assert meta["synthetic_images"] == 12 and Path(meta["data_root"]).parent == tmp_path / "tmp"

    from profiler.whatif.source import read_run

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "again"))
    (tmp_path / "again").mkdir()
    src = read_run(str(tmp_path / "run"))
    assert src.data_root is not None and src.data_root.parent == tmp_path / "again"
    images = [p for p in src.data_root.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png")]
    assert len(images) == 12
