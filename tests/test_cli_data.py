"""`stallscope data make`: writes a set, is a no-op on a complete one, and refuses bad input with exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import stallscope


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
