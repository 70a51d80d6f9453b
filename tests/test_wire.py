"""What crosses between the training process and its sampler process (profiler.core.sampler_process.wire): each
item and line read back as it was put, and what one side does not know skipped, not fatal."""

from __future__ import annotations

import json
import math

from profiler.core.sampler_process import wire

ITEMS = [
    wire.Meta({"batch_size": 32, "loader": {"num_workers": 2}}),
    wire.RunEvent(1.25, "warning", "nvml", "NVML unavailable"),
    wire.RunEvent(2.0, "note", None, "no source named"),
    wire.Samples([[0.5, "host", "cpu_percent", 12.5], [0.5, "pin", "bytes", None]]),
    wire.Rescan(),
    wire.ReadMemory(),
    wire.PySpy(4242, 100, 5.0, "py-spy is not installed"),
    wire.Close("complete"),
    wire.Close("failed", "ValueError: x", {"pin": {"reads": 3}}),
]


def test_every_item_is_read_back_as_it_was_put() -> None:
    for item in ITEMS:
        got = list(wire.decode(wire.encode(item)))
        assert got == [item], (item, got)


def test_an_item_of_a_key_this_side_does_not_know_is_skipped() -> None:
    raw = json.dumps({"later": {"x": 1}, "rescan": 1}).encode()
    assert list(wire.decode(raw)) == [wire.Rescan()]


def test_a_reading_that_is_not_a_number_crosses_as_json_allows() -> None:
    (got,) = wire.decode(wire.encode(wire.Samples([[0.1, "host", "x", math.nan]])))
    assert isinstance(got, wire.Samples) and math.isnan(got.rows[0][3])


def test_every_line_is_heard_as_it_was_said_and_a_stray_print_is_not() -> None:
    for said in (wire.Ready(), wire.Log(30, "a warning"), wire.Final("/tmp/x.pickle")):
        raw = wire.line(said)
        assert raw.endswith(b"\n") and raw.count(b"\n") == 1
        assert wire.heard(raw.rstrip(b"\n")) == said
    assert wire.heard(b"hello from a print") is None
    assert wire.heard(b"[1, 2]") is None
    assert wire.heard(b'{"other": 1}') is None


def test_the_ring_record_kinds_are_distinct() -> None:
    kinds = [wire.PAD, wire.NAME, wire.BLOB, wire.EVENTS, wire.NEXT]
    assert len(set(kinds)) == len(kinds) and all(0 <= k < 256 for k in kinds)  # one byte in a record's head
