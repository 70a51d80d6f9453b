"""Step events (profiler.core.steps.events): the rows an Assembler makes of them, their trip through the ring, and the
rows of one run made in both processes."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import pytest
import torch

from profiler import Session
from profiler.core.rows import PhaseRow, StepRow
from profiler.core.sampler_process.ring import Ring, RingReader, RingWriter
from profiler.core.steps.batch_facts import BatchLen, batch_len
from profiler.core.steps.events import (
    BATCH,
    DEV,
    END,
    ENTER,
    EXIT,
    FETCH,
    NAN,
    NO_MARK,
    OPEN,
    SAMPLES,
    SPAN,
    WAIT,
    Assembler,
    ListLog,
    Tee,
)
from profiler.core.store import load_run

NAMES = {0: "h2d", 1: "compute", 2: "sync"}


def _assemble(events: list[tuple[int, int, float, float, float]], **kw: object) -> Assembler:
    asm = Assembler(10.0, 1, dict(NAMES), **kw)  # type: ignore[arg-type]
    asm.feed(events)
    return asm


def test_steps_and_nested_phases_from_events() -> None:
    asm = _assemble([
        (FETCH, 0, 10.0, 1.0, 0), (BATCH, 0, 10.5, 1.25, 32),
        (ENTER, 0, 10.5, 1.25, NO_MARK), (EXIT, 0, 11.0, 1.5, NO_MARK),
        (ENTER, 1, 11.0, 1.5, NO_MARK), (SPAN, 2, 11.2, 11.3, NAN), (EXIT, 1, 12.0, 2.0, NO_MARK),
        (FETCH, 0, 12.5, 2.5, 1), (BATCH, 0, 13.0, NAN, -1),
        (ENTER, 1, 13.0, NAN, NO_MARK), (EXIT, 1, 14.0, NAN, NO_MARK),
        (FETCH, 0, 14.0, 3.0, 2),
    ])  # fmt: skip
    rows = asm.take()
    assert [r for r, _ in rows] == [
        StepRow(0, 0.0, 2.5, 0.5, 32, True, 0.25, 1.5),
        StepRow(1, 2.5, 4.0, 0.5, None, False, None, None),  # not read (BATCH's x NaN): no run-queue figures
    ]
    assert rows[0][1] == [
        PhaseRow(0, "h2d", 0, 0.5, 1.0, None, None, 0.25),
        PhaseRow(0, "compute/sync", 1, pytest.approx(1.2), pytest.approx(1.3), None, None, None),
        PhaseRow(0, "compute", 0, 1.0, 2.0, None, None, 0.5),
    ]
    assert rows[1][1] == [PhaseRow(1, "compute", 0, 3.0, 4.0, None, None, None)]
    assert asm.resume == (0, 2)  # step 2 is open: a reader resuming would read it again


def test_a_loader_that_ends_drops_the_step_waiting_for_its_batch() -> None:
    asm = _assemble(
        [(FETCH, 0, 10.0, NAN, 0), (BATCH, 0, 10.0, NAN, 4), (FETCH, 0, 11.0, NAN, 1), (END, 0, 11.0, NAN, NAN)]
    )
    assert [r.step for r, _ in asm.take()] == [0] and asm.resume is None and asm.next_step == 1


def test_steps_opened_from_outside_count_waits_and_samples() -> None:
    asm = _assemble([
        (OPEN, 0, 10.0, 1.0, 0), (WAIT, 0, 0.0, 0.25, 1.125), (SAMPLES, 0, 0.0, 8, NAN), (SAMPLES, 0, 0.0, 8, NAN),
        (OPEN, 0, 11.0, NAN, 1), (SAMPLES, 0, 0.0, 8, NAN), (SAMPLES, 0, 0.0, -1, NAN), (SAMPLES, 0, 0.0, 8, NAN),
        (END, 0, 12.0, NAN, NAN),
    ])  # fmt: skip
    assert [r for r, _ in asm.take()] == [
        StepRow(0, 0.0, 1.0, 0.25, 16, True, 0.125, None),  # its end was not read (NaN)
        StepRow(1, 1.0, 2.0, 0.0, None, False, None, None),  # a batch whose size cannot be told: the count is unknown
    ]


def test_a_step_with_device_marks_waits_for_their_times_and_finish_lets_it_go() -> None:
    asm = _assemble([
        (FETCH, 0, 10.0, NAN, 0), (BATCH, 0, 10.0, NAN, 1),
        (ENTER, 0, 10.0, NAN, 0), (EXIT, 0, 10.5, NAN, 1), (ENTER, 1, 10.5, NAN, 1), (EXIT, 1, 11.0, NAN, 2),
        (FETCH, 0, 11.0, NAN, 1), (BATCH, 0, 11.0, NAN, 1), (ENTER, 1, 11.0, NAN, 3), (EXIT, 1, 11.5, NAN, 4),
        (FETCH, 0, 12.0, NAN, 2), (BATCH, 0, 12.0, NAN, 1),  # step 1 ended
    ])  # fmt: skip
    assert asm.take() == [] and asm.resume == (0, 0)
    asm.feed([(DEV, 0, 0.1, 0, NAN), (DEV, 0, 0.75, 1, NAN), (DEV, 0, 1.25, 2, NAN)])
    (row, phases), = asm.take()  # fmt: skip
    assert row.step == 0
    assert [(p.name, p.dev_start, p.dev_end) for p in phases] == [("h2d", 0.1, 0.75), ("compute", 0.75, 1.25)]
    asm.feed([(DEV, 0, 1.5, 3, NAN)])  # step 1's second mark never comes
    assert asm.take() == []
    asm.finish()
    (row, phases), = asm.take()  # fmt: skip
    assert row.step == 1 and (phases[0].dev_start, phases[0].dev_end) == (1.5, None)


def test_a_resumed_reader_drops_the_steps_handed_out_before_it() -> None:
    events = [(FETCH, 0, 10.0 + i, NAN, i) for i in range(4)]
    events = [e for i, f in enumerate(events) for e in (f, (BATCH, 0, 10.0 + i, NAN, 1))]
    asm = _assemble(events, first_step=2)
    assert [r.step for r, _ in asm.take()] == [2]  # step 3 still open


def test_events_cross_the_ring_in_order_across_its_end_and_from_other_threads() -> None:
    ring = Ring.create(4096)
    writer, reader = RingWriter(ring), RingReader(ring)
    ident = writer.name_id("compute")
    assert writer.name_id("compute") == ident
    got: list[tuple[int, int, float, float, float]] = []
    sent: list[tuple[int, int, float, float, float]] = []
    for k in range(40):  # 40 x 7 events of 40 bytes: the ring's 4 KiB wraps several times
        batch = [(ENTER, ident, float(k), float(i), NAN) for i in range(7)]
        for ev in batch:
            writer.put(ev)
        sent += batch
        writer.flush_events()
        for kind, value in reader.records():
            assert kind == "event"
            got.append(value[0])
        ring.set_read(reader.pos)
    assert [g[:4] for g in got] == [s[:4] for s in sent] and all(math.isnan(g[4]) for g in got)
    assert reader.names == {ident: "compute"}

    # an event put by another thread while a flush copies is kept for the next flush
    def put_more() -> None:
        for i in range(20_000):
            writer.put((EXIT, 0, 0.0, float(i), 0.0))
            if i % 50 == 0:
                time.sleep(0)

    t = threading.Thread(target=put_more)
    t.start()
    seen: list[float] = []
    while t.is_alive() or writer.events or writer.pending():
        writer.flush()
        writer.flush_events()
        seen += [v[0][3] for _, v in reader.records()]
        ring.set_read(reader.pos)
    t.join()
    assert seen == [float(i) for i in range(20_000)]
    ring.close()


def test_a_tee_puts_to_both_with_the_streams_ids() -> None:
    stream, log = ListLog({0: "h2d"}), ListLog()
    tee = Tee(stream, log)
    assert tee.name_id("compute") == 1 and log.names == {1: "compute"}
    tee.put((FETCH, 0, 1.0, NAN, 0))
    assert stream.take() == log.take() == [(FETCH, 0, 1.0, NAN, 0)]


@pytest.mark.timing
def test_rows_made_in_the_training_process_equal_the_stores_rows(tmp_path: Path) -> None:
    """One run: its rows made by the sampler process (the store) and by this process (``recent``, asked for before
    the first step) from the same events."""
    with Session(tmp_path, sample_hz=20, device="cpu", warmup=2) as s:
        here = s.recent
        for i, _ in enumerate(s.wrap([[0] * 8] * 60)):
            with s.phase("h2d"):
                time.sleep(0.001)
            with s.phase("compute"):
                with s.phase("forward"):
                    time.sleep(0.001)
                s.span("sync", s.clock() - 0.0005, s.clock())
            if i == 30:
                s.annotate(half=True)
    rec = load_run(tmp_path)
    assert len(rec.steps) == 60 and len(here) == 60
    assert [r for r, _ in here] == rec.steps
    order = {(p.step, p.name): k for k, p in enumerate(rec.phases)}
    assert sorted((p for _, ps in here for p in ps), key=lambda p: order[(p.step, p.name)]) == rec.phases


def test_batch_len_keeps_the_way_to_the_length() -> None:
    count = BatchLen()
    batches = [
        (torch.zeros(32, 3), torch.zeros(32)), (torch.zeros(7, 3), torch.zeros(7)), [torch.zeros(5), 1],
        torch.zeros(6, 2), torch.zeros(4), torch.tensor(3.0), [1, 2, 3], {"x": torch.zeros(9)}, [{"a": 1}] * 4,
        (torch.tensor(1.0),), (torch.zeros(2, 2),),
    ]  # fmt: skip
    assert [count(b) for b in batches] == [batch_len(b) for b in batches] == [32, 7, 5, 6, 4, None, 3, 9, None, None, 2]
