"""The order the suite's work units are handed out in (tests/scheduling.py): the units a CI run measured longest first,
from tests/data/unit_seconds.json, and that table names tests that exist."""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import scheduling
from conftest import ROOT


@dataclass
class Item:
    """What run_order reads of a pytest item: its node id and its markers."""

    nodeid: str
    marks: dict[str, Any] = field(default_factory=dict)

    def get_closest_marker(self, name: str) -> Any:
        return self.marks.get(name)


def test_the_units_measured_longest_go_first_then_the_most_tests_and_the_alone_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    light = pytest.mark.light(seconds=5).mark
    items = [
        *(Item(f"tests/test_many.py::test_{i}") for i in range(3)),  # no shared fixture: three units of one test
        Item("tests/test_x.py::test_short"),
        Item("tests/test_x.py::test_long"),
        Item("tests/test_x.py::test_longer"),
        Item("tests/test_x.py::test_alone", {"alone": pytest.mark.alone.mark}),
        Item("tests/test_x.py::test_light", {"light": light}),
    ]
    recorded = {
        "tests/test_x.py::test_long": 40.0,
        "tests/test_x.py::test_longer": 90.0,
        "tests/test_x.py::test_alone": 99.0,
    }
    monkeypatch.setattr(scheduling, "recorded_seconds", lambda: recorded)
    order = [i.nodeid.split("::")[1] for i in scheduling.run_order(items)]  # type: ignore[arg-type]
    assert order == ["test_longer", "test_long", "test_0", "test_1", "test_2", "test_short", "test_light", "test_alone"]
    monkeypatch.setattr(scheduling, "recorded_seconds", dict)  # without a record: by test count, as before
    order = [i.nodeid.split("::")[1] for i in scheduling.run_order(items)]  # type: ignore[arg-type]
    assert order[:3] == ["test_0", "test_1", "test_2"] and order[-2:] == ["test_light", "test_alone"]


def test_every_unit_in_the_table_names_a_test_or_doc_that_exists() -> None:
    """A renamed test would silently fall back to the short end of the order: the table is regenerated instead
    (benchmarks/unit_seconds.py)."""
    table = scheduling.recorded_seconds()
    assert len(table) >= 20 and all(s > 0 for s in table.values())
    missing = []
    groups = {scheduling.file_group(str(f.relative_to(ROOT))) for f in (ROOT / "tests").glob("test_*.py")}
    for unit in table:
        if unit.startswith("group:"):  # the files that name one group (scheduling.GROUP)
            if unit.removeprefix("group:") not in groups:
                missing.append(unit)
            continue
        path, _, test = unit.partition("::")
        file = ROOT / path
        name = re.sub(r"\[.*\]$", "", test)
        if not file.is_file() or (name and f"def {name}(" not in file.read_text(encoding="utf-8")):
            missing.append(unit)
    assert missing == [], f"units no longer in the suite: {missing}; regenerate {scheduling.UNIT_SECONDS}"
    assert Path(scheduling.UNIT_SECONDS).is_relative_to(ROOT)


def test_the_table_is_each_units_phases_summed_from_a_durations_list(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import unit_seconds
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    log = tmp_path / "log"
    log.write_text(
        "..F.\n"
        "============================= slowest 90 durations =============================\n"
        "40.50s call     tests/test_x.py::test_a[one two]\n"
        "12.25s setup    tests/test_x.py::test_a[one two]\n"
        "30.00s call     tests/test_docs_examples.py::test_documented_command[docs/whatif.md:45]\n"
        "9.00s call     tests/test_docs_examples.py::test_documented_command[docs/whatif.md:80]\n"
        "=========================== short test summary info ============================\n"
        "1.00s call     tests/test_x.py::test_after_the_list\n"
    )
    out = tmp_path / "table.json"
    assert unit_seconds.main([str(log), "--note", "a made-up run", "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table == {
        "source": "a made-up run",
        "seconds": {"tests/test_x.py::test_a[one two]": 52.8, "docs/whatif.md": 39.0},  # a doc's commands: one unit
    }
    (tmp_path / "none").write_text("no list here\n")
    assert unit_seconds.main([str(tmp_path / "none"), "--out", str(out)]) == 2


def test_the_files_that_name_one_group_are_one_unit() -> None:
    """The three Ray files start a local Ray instance each: one unit runs them one after another on one worker, not
    three instances at once on the 2 cores."""
    ray_files = ("tests/test_pipelines_ray.py", "tests/test_ray_report.py", "tests/test_whatif_ray.py")
    units = {scheduling.work_unit(f"{f}::test_x") for f in ray_files}
    assert units == {"group:ray"}
    assert scheduling.work_unit("tests/test_store.py::test_x") == "tests/test_store.py::test_x"  # no group, no fixture
