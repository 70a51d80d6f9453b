"""py-spy stacks: parsing recorded and hand-made output, main-thread phases, worker attribution, one live run."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from profiler.analysis.attribution import (
    CATEGORIES,
    PHASES,
    attribute_workers,
    classify_main,
    classify_main_sample,
    classify_worker_frames,
    find_copy_sites,
    headline,
)
from profiler.analysis.stacks import (
    Frame,
    StackSample,
    chunk_by_order,
    file_matches,
    identify,
    infer_idle,
    parse_collapsed,
    parse_collapsed_stats,
    parse_frame,
    parse_speedscope,
    parse_speedscope_stats,
    wilson,
)

DATA = Path(__file__).parent / "data" / "pyspy"
SCRIPT_SITES = find_copy_sites((DATA / "train_jpeg.py").read_text(), "train_jpeg.py")


def read(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def fr(text: str) -> Frame:
    return parse_frame(text)


def stack(*frames: str) -> tuple[Frame, ...]:
    return tuple(parse_frame(f) for f in frames)


# --- recorded output -----------------------------------------------------------------------------------------


def test_recorded_launch_mode() -> None:
    samples, st = parse_collapsed_stats(read("train_workers2_raw.txt"))
    assert (st.lines, st.records, st.samples, st.bad_records, st.truncated) == (131, 131, 1337, 0, 0)
    assert sum(s.count for s in samples) == 1337
    assert {s.process for s in samples} == {".venv/bin/python tests/data/pyspy/train_jpeg.py 3"}
    roles = identify(samples)
    assert (roles.main_pid, roles.main_thread, roles.main_rule) == (21357, "21357", "tid == pid")
    assert roles.worker_pids == (21364, 21365) and roles.other_pids == ()
    assert sorted(roles.threads.values()) == ["MainThread", "QueueFeederThread", "QueueFeederThread"]
    # workers were forked by the main process: py-spy names it as their parent
    assert {s.parent_pids for s in samples if s.pid in roles.worker_pids} == {(21357,)}
    # every thread's samples: with --idle each thread gets one per tick, so its count / rate is its lifetime
    per_thread: Counter[tuple[int | None, str | None]] = Counter()
    for s in samples:
        per_thread[(s.pid, s.thread)] += s.count
    assert per_thread[(21357, "21357")] > per_thread[(21364, "21364")] > 100


def test_recorded_launch_main_thread_phases() -> None:
    est = classify_main([parse_collapsed(read("train_workers2_raw.txt"))], rate_hz=50, h2d_sites=SCRIPT_SITES)
    o = est.overall
    assert o.excluded > 0  # start-up (empty stacks, imports) is kept out of the fractions
    assert o.n == sum(sh.count for sh in o.shares.values())
    assert math.isclose(sum(sh.fraction for sh in o.shares.values()), 1.0)
    assert o.seconds == pytest.approx((o.n + o.excluded) / 50)
    for sh in o.shares.values():
        assert sh.low <= sh.fraction <= sh.high
    assert o.shares["data_wait"].count > 0 and o.shares["compute"].count > 0 and o.shares["h2d"].count > 0
    assert o.shares["data_wait"].fraction + o.shares["compute"].fraction > 0.8
    assert est.notes == ()  # sites given, thread ids present


def test_recorded_workers_attribution() -> None:
    att = attribute_workers(parse_collapsed(read("train_workers2_raw.txt")), rate_hz=50)
    assert att.worker_pids == (21364, 21365)
    assert att.samples == att.idle + att.active and att.idle > att.active > 100
    assert att.busy_seconds == pytest.approx(att.active / 50)
    assert sum(sh.count for sh in att.shares.values()) == att.active
    assert att.top["decode"][0].function == "ImageFile.load (PIL/ImageFile.py)"
    assert att.top["collate"][0].function == "collate_tensor_fn (torch/utils/data/_utils/collate.py)"
    assert any("torchvision/transforms" in t.function for t in att.top["augment"])
    assert att.shares["decode"].fraction + att.shares["augment"].fraction > 0.7
    for cat in CATEGORIES:
        assert len(att.top[cat]) <= 5
        assert sum(t.of_category for t in att.top[cat]) <= 1.0 + 1e-9


def test_recorded_attach_mode() -> None:
    samples = parse_collapsed(read("attach_raw.txt"))
    assert sum(s.count for s in samples) == 1335
    roles = identify(samples, root_pid=20178)
    assert (roles.main_pid, roles.main_thread, roles.worker_pids) == (20178, "20178", (20182, 20183))
    est = classify_main([samples], rate_hz=50, root_pid=20178, h2d_sites=SCRIPT_SITES)
    # attached after start-up: no empty or import stacks, and 3 s at 50 Hz is about 150 main-thread samples
    assert est.overall.excluded == 0
    assert 130 <= est.overall.n <= 170


def test_recorded_odd_command_line() -> None:
    text = read("cmdline_odd_raw.txt")
    samples, st = parse_collapsed_stats(text)
    assert st.bad_records == 0 and st.records == 116 and st.lines == 320 and st.samples == 1146
    cmd = (
        '.venv/bin/python /tmp/pyspy_rec/dir with space/train_jpeg.py 2 --tag a "quoted" arg; semi;colon line1\n'
        'line2 x";y'
    )
    assert {s.process for s in samples} == {cmd}  # workers are forks: same argv
    roles = identify(samples)
    assert (roles.main_pid, roles.main_thread, roles.worker_pids) == (20210, "20210", (20228, 20230))
    # the script's own frames still parse behind the odd command line
    assert any(f.function == "<module>" and f.file == "train_jpeg.py" for s in samples for f in s.frames)


def test_recorded_truncated_without_subprocesses_or_threads() -> None:
    samples, st = parse_collapsed_stats(read("truncated_nosub_raw.txt"))
    assert (st.truncated, st.records, st.samples, st.bad_records) == (1, 23, 341, 0)
    assert all(s.pid is None and s.thread is None and s.process is None for s in samples)
    roles = identify(samples)
    assert roles.main_rule == "not a threading root" and roles.worker_pids == ()
    est = classify_main([samples], rate_hz=50)
    assert est.overall.n > 50 and any("--threads" in n for n in est.notes)
    att = attribute_workers(samples)
    assert att.active == 0 and math.isnan(att.shares["decode"].fraction) and att.notes


def test_recorded_speedscope() -> None:
    samples, st = parse_speedscope_stats(read("attach_speedscope.json"))
    assert st.error is None and st.bad_records == 0 and st.records == 1341 == 9 * 149
    per = Counter((s.pid, s.thread, s.thread_name) for s in samples)
    assert per[(20178, "20178", "MainThread")] == 149 and per[(20182, "20189", "Thread-1 (_serve)")] == 149
    main = [s for s in samples if s.pid == 20178 and s.thread == "20178"]
    assert [s.order for s in main] == list(range(149))
    assert all(s.process == ".venv/bin/python tests/data/pyspy/train_jpeg.py 20" for s in samples)
    assert all(not f.function.startswith(("process ", "thread (")) for s in samples for f in s.frames)
    assert main[0].frames[0].file.endswith("/tests/data/pyspy/train_jpeg.py")  # speedscope keeps full paths
    chunks = chunk_by_order(samples, rate_hz=50, window_s=1.0)
    est = classify_main(chunks, rate_hz=50, root_pid=20178, h2d_sites=SCRIPT_SITES)
    assert [w.n for w in est.windows] == [50, 50, 49]
    assert est.overall.n == 149
    att = attribute_workers(samples, root_pid=20178)
    assert att.worker_pids == (20182, 20183) and att.top["decode"][0].function.startswith("ImageFile.load (")


def test_speedscope_bad_input_does_not_raise() -> None:
    assert parse_speedscope_stats("{not json")[1].error is not None
    assert parse_speedscope_stats('{"profiles": []}')[1].error is not None
    doc = (
        '{"shared": {"frames": [{"name": "f", "file": "a.py", "line": 1}]}, '
        '"profiles": [{"name": "x", "samples": [[0], [7]]}]}'
    )
    samples, st = parse_speedscope_stats(doc)
    assert len(samples) == 1 and st.bad_records == 1  # a bad index spoils that entry only
    assert len(parse_speedscope(doc)) == 1


# --- hand-made collapsed text --------------------------------------------------------------------------------


def test_command_line_with_spaces_quotes_semicolons_and_newline() -> None:
    # py-spy joins argv with spaces and escapes nothing (stack_trace.rs: format!("process {}:\"{}\"", ...))
    cmd = 'python my script.py --x "a;b" line1\nline2 q";r'
    text = (
        f'process 7:"{cmd}";thread (7): MainThread;<module> (my script.py:3);f (my script.py:9) 4\n'
        f'process 7:"{cmd}";process 8:"{cmd}";thread (8): MainThread;<module> (my script.py:3) 2\n'
        f'process 7:"{cmd}" 1\n'
    )
    samples, st = parse_collapsed_stats(text)
    assert st.bad_records == 0 and st.records == 3 and st.lines == 7
    assert [s.process for s in samples] == [cmd, cmd, cmd]
    assert [s.pid for s in samples] == [7, 8, 7] and samples[1].parent_pids == (7,)
    assert samples[0].frames == (Frame("<module>", "my script.py", 3), Frame("f", "my script.py", 9))
    assert samples[2].frames == () and samples[2].thread is None


def test_command_line_quote_semicolon_first_seen_is_split_at_a_frame() -> None:
    samples = parse_collapsed('process 3:"python a.py x";y";<module> (a.py:1) 2\n')
    assert samples[0].process == 'python a.py x";y' and samples[0].frames == (Frame("<module>", "a.py", 1),)


def test_threads_unnamed_hex_and_with_semicolons() -> None:
    text = (
        "thread (123);f (x.py:1) 1\n"
        "thread (0x7F3A2B1C4700): MainThread;<module> (x.py:1) 2\n"
        "thread (5): my;odd name;<module> (x.py:1) 3\n"
        "thread (6): Thread-1 (_serve);Thread._bootstrap (threading.py:1002) 1\n"
    )
    samples = parse_collapsed(text)
    assert [(s.thread, s.thread_name) for s in samples] == [
        ("123", None),
        ("0x7F3A2B1C4700", "MainThread"),
        ("5", "my;odd name"),
        ("6", "Thread-1 (_serve)"),
    ]
    assert all(len(s.frames) == 1 for s in samples)


@pytest.mark.parametrize(
    ("text", "function", "name", "file", "line"),
    [
        ("Module._call_impl (torch/nn/modules/module.py:1794)", "Module._call_impl", "_call_impl", None, 1794),
        ("_call_impl (torch/nn/modules/module.py:1794)", "_call_impl", "_call_impl", None, 1794),  # co_name form
        ("collate.<locals>.<listcomp> (torch/utils/data/_utils/collate.py:215)", None, "<listcomp>", None, 215),
        ("<listcomp> (x.py:4)", "<listcomp>", "<listcomp>", "x.py", 4),  # 3.11 and older py-spy; gone in 3.12
        ("f.<locals>.<genexpr> (x.py:5)", None, "<genexpr>", "x.py", 5),  # 3.12/3.13 keep generator frames
        ("<module> (train.py:1)", "<module>", "<module>", "train.py", 1),
        ("f.<locals>.<lambda> (x.py:2)", None, "<lambda>", "x.py", 2),
        ("_find_and_load (<frozen importlib._bootstrap>:1176)", None, "_find_and_load", None, 1176),
        ("f (x.py)", "f", "f", "x.py", None),  # --nolineno, or line 0
        ("g (dir (1)/x.py:3)", "g", "g", "dir (1)/x.py", 3),
        ("native_thing", "native_thing", "native_thing", "", None),
    ],
)
def test_frame_forms(text: str, function: str | None, name: str, file: str | None, line: int | None) -> None:
    f = parse_frame(text)
    assert f.name == name and f.line == line
    if function is not None:
        assert f.function == function
    if file is not None:
        assert f.file == file
    if "<frozen" in text:
        assert f.file == "<frozen importlib._bootstrap>"


def test_bad_lines_blank_lines_and_truncation_are_counted_not_raised() -> None:
    text = (
        "\n"
        "f (x.py:1) 5\n"
        "no count here\n"
        "f (x.py:1) 1.5\n"
        "f (x.py:1) 0\n"
        'process 12:"unterminated;f (x.py:1) 3\n'
        "thread (zz;f (x.py:1) 2\n"
        "   \n"
        "g (y.py:2) 3\n"
        "h (z.py:3"
    )
    samples, st = parse_collapsed_stats(text)
    assert [s.count for s in samples] == [5, 3]
    assert (st.bad_records, st.blank_lines, st.truncated, st.unterminated) == (5, 2, 1, False)
    assert st.examples[0] == "no count here" and len(st.examples) == 3
    # an unterminated final record that parses is kept, but flagged: its count may have lost digits
    samples, st = parse_collapsed_stats("f (x.py:1) 5\ng (y.py:2) 1")
    assert [s.count for s in samples] == [5, 1] and st.unterminated and st.truncated == 0
    assert parse_collapsed_stats("")[1].records == 0


def test_idle_inference() -> None:
    assert infer_idle(stack("Queue.get (multiprocessing/queues.py:122)", "_PollLikeSelector.select (selectors.py:415)"))
    assert infer_idle(stack("Queue._feed (multiprocessing/queues.py:231)", "Condition.wait (threading.py:327)"))
    assert infer_idle(stack("socket.accept (socket.py:294)"))
    assert infer_idle(
        stack(
            "_ConnectionBase.recv_bytes (multiprocessing/connection.py:216)",
            "Connection._recv (multiprocessing/connection.py:395)",
        )
    )
    assert infer_idle(stack("select (/usr/lib/python3.12/selectors.py:415)"))  # co_name form, full path
    assert not infer_idle(stack("ImageFile.load (PIL/ImageFile.py:425)"))
    assert not infer_idle(stack("Condition.wait (threading.py:327)", "f (x.py:1)"))  # only the innermost counts
    assert not infer_idle(())


def test_file_matches() -> None:
    assert file_matches("torch/nn/modules/module.py", "torch/nn/modules/")
    assert file_matches("/v/lib/python3.11/site-packages/torch/nn/modules/module.py", "torch/nn/modules/module.py")
    assert file_matches("C:\\py\\Lib\\threading.py", "threading.py")
    assert not file_matches("mythreading.py", "threading.py")
    assert not file_matches("nottorch/nn/modules/x.py", "torch/nn/modules/")


def test_wilson() -> None:
    lo, hi = wilson(70, 100)
    assert lo == pytest.approx(0.6042, abs=1e-4) and hi == pytest.approx(0.7811, abs=1e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    assert wilson(0, 10)[0] == 0.0 and wilson(10, 10)[1] == 1.0


# --- main thread ---------------------------------------------------------------------------------------------

LOOP = ("<module> (train.py:80)", "main (train.py:50)")
NEXT = (
    "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)",
    "_MultiProcessingDataLoaderIter._next_data (torch/utils/data/dataloader.py:1507)",
    "Queue.get (multiprocessing/queues.py:122)",
    "_PollLikeSelector.select (selectors.py:415)",
)
FORWARD = (
    "Module._wrapped_call_impl (torch/nn/modules/module.py:1783)",
    "Module._call_impl (torch/nn/modules/module.py:1794)",
    "Net.forward (model.py:20)",
)


def sample(
    *frames: str,
    count: int = 1,
    pid: int | None = 1,
    thread: str | None = "1",
    thread_name: str | None = None,
    parent_pids: tuple[int, ...] = (),
    order: int | None = None,
) -> StackSample:
    fs = stack(*frames)
    return StackSample(
        pid=pid,
        process="python train.py",
        thread=thread,
        frames=fs,
        count=count,
        idle=infer_idle(fs),
        thread_name=thread_name,
        parent_pids=parent_pids,
        order=order,
    )


def test_main_data_wait_fraction_with_wilson_interval() -> None:
    samples = [sample(*LOOP, *NEXT, count=70), sample(*LOOP, *FORWARD, count=30)]
    est = classify_main([samples], rate_hz=100)
    dw = est.overall.shares["data_wait"]
    assert (dw.count, dw.n, dw.fraction) == (70, 100, 0.70)
    assert dw.low < 0.70 < dw.high and (dw.low, dw.high) == wilson(70, 100)
    assert est.overall.shares["compute"].fraction == 0.30
    assert est.overall.seconds == 1.0 and est.main_rule == "tid == pid"


def test_main_priority_data_wait_over_compute_inside_next() -> None:
    # num_workers=0: transforms run inside next() and v2 transforms are nn.Modules; it is still data wait
    frames = stack(
        *LOOP,
        "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)",
        "_SingleProcessDataLoaderIter._next_data (torch/utils/data/dataloader.py:790)",
        "JpegDataset.__getitem__ (train.py:30)",
        "Module._call_impl (torch/nn/modules/module.py:1794)",
        "Compose.forward (torchvision/transforms/v2/_container.py:52)",
    )
    assert classify_main_sample(frames) == "data_wait"
    assert classify_main_sample(stack(*LOOP, "Tensor.backward (torch/_tensor.py:647)")) == "compute"
    assert classify_main_sample(stack(*LOOP, "backward (torch/_tensor.py:647)")) == "compute"  # co_name form
    assert classify_main_sample(stack(*LOOP, "SGD.step (torch/optim/sgd.py:80)")) == "compute"
    assert classify_main_sample(stack(*LOOP, "__next__ (nvidia/dali/plugin/pytorch/__init__.py:200)")) == "data_wait"
    assert (
        classify_main_sample(stack(*LOOP, "move_data_to_device (lightning/fabric/utilities/apply_func.py:9)")) == "h2d"
    )


def test_main_h2d_only_where_visible() -> None:
    copy_line = ("<module> (train.py:80)", "main (train.py:57)")
    on_copy_line = stack(*copy_line)
    assert classify_main_sample(on_copy_line) == "other"  # .to() is a C call: no frame of its own
    assert classify_main_sample(on_copy_line, {("train.py", 57)}) == "h2d"
    assert classify_main_sample(on_copy_line, {("/home/u/proj/train.py", 57)}) == "h2d"  # full path given
    assert classify_main_sample(stack("<module> (train.py:57)", "f (train.py:3)"), {("train.py", 57)}) == "other"
    est = classify_main([[sample(*copy_line, count=10)]], rate_hz=10)
    assert est.overall.shares["other"].count == 10 and any("h2d" in n for n in est.notes)


def test_main_excluded_startup_and_pin_thread() -> None:
    samples = [
        sample(count=5),  # no Python frame
        sample("<module> (train.py:1)", "_find_and_load (<frozen importlib._bootstrap>:1176)", count=7),
        sample(*LOOP, *FORWARD, count=8),
        sample(
            "Thread._bootstrap (threading.py:1002)",
            "_pin_memory_loop (torch/utils/data/_utils/pin_memory.py:59)",
            "pin_memory (torch/utils/data/_utils/pin_memory.py:70)",
            count=4,
            thread="9",
            thread_name="Thread-2 (_pin_memory_loop)",
        ),
    ]
    est = classify_main([samples], rate_hz=10)
    assert (est.overall.n, est.overall.excluded, est.overall.seconds) == (8, 12, 2.0)
    assert est.pin_memory_samples == 4 and est.overall.shares["compute"].fraction == 1.0


def test_main_windows_are_per_chunk() -> None:
    a = [sample(*LOOP, *NEXT, count=9), sample(*LOOP, *FORWARD, count=1)]
    b = [sample(*LOOP, *NEXT, count=1), sample(*LOOP, *FORWARD, count=9)]
    est = classify_main([a, b], rate_hz=10)
    assert [w.shares["data_wait"].fraction for w in est.windows] == [0.9, 0.1]
    assert est.overall.shares["data_wait"].fraction == 0.5 and est.overall.n == 20
    empty = classify_main([[]], rate_hz=10).overall.shares["compute"]
    assert math.isnan(empty.fraction) and (empty.low, empty.high) == (0.0, 1.0)
    with pytest.raises(ValueError, match="rate_hz"):
        classify_main([a], rate_hz=0)


def test_chunk_by_order() -> None:
    ordered = [sample(*LOOP, order=i) for i in range(25)]
    assert [len(c) for c in chunk_by_order(ordered, rate_hz=10, window_s=1)] == [10, 10, 5]
    with pytest.raises(ValueError, match="no order"):
        chunk_by_order([sample(*LOOP)], rate_hz=10, window_s=1)


def test_main_thread_rules() -> None:
    bootstrap = "Thread._bootstrap (threading.py:1002)"
    # tid == pid wins even while unnamed
    r = identify([sample(*LOOP, thread="1"), sample(bootstrap, thread="2", thread_name="MainThread")])
    assert (r.main_thread, r.main_rule) == ("1", "tid == pid")
    # hex pthread ids: by name, and the unnamed early samples of the same id are included
    hexs = [
        sample(*LOOP, thread="0xA"),
        sample(*LOOP, thread="0xA", thread_name="MainThread"),
        sample(bootstrap, thread="0xB"),
    ]
    r = identify(hexs)
    assert (r.main_thread, r.main_rule) == ("0xA", "MainThread") and r.is_main_thread(hexs[0])
    # no names: the thread rooted at <module>
    r = identify([sample(bootstrap, thread="0xB", count=50), sample(*LOOP, thread="0xA")])
    assert (r.main_thread, r.main_rule) == ("0xA", "<module> root")
    # no thread frames: everything not started by threading
    nothreads = [sample(*LOOP, thread=None, pid=None), sample(bootstrap, thread=None, pid=None)]
    r = identify(nothreads)
    assert [r.is_main_thread(s) for s in nothreads] == [True, False]
    # root_pid without samples (py-spy attached to a shell): the outermost sampled process
    r = identify([sample(*LOOP, pid=5, thread="5", parent_pids=(4,))], root_pid=4)
    assert r.main_pid == 5


# --- workers -------------------------------------------------------------------------------------------------

FORK = (
    "<module> (train.py:80)",
    "train_and_transform (train.py:50)",  # a name keyword rule would match: must not, it is the parent's
    "_MultiProcessingDataLoaderIter.__init__ (torch/utils/data/dataloader.py:1178)",
    "Popen._launch (multiprocessing/popen_fork.py:71)",
    "BaseProcess._bootstrap (multiprocessing/process.py:314)",
    "BaseProcess.run (multiprocessing/process.py:108)",
    "_worker_loop (torch/utils/data/_utils/worker.py:375)",
)
FETCH = (
    "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:54)",
    "_MapDatasetFetcher.fetch.<locals>.<listcomp> (torch/utils/data/_utils/fetch.py:54)",
    "MyDataset.__getitem__ (ds.py:10)",
)


def worker(*frames: str, count: int, thread: str = "2", pid: int = 2) -> StackSample:
    return sample(*frames, count=count, pid=pid, thread=thread, parent_pids=(1,))


def known_workers() -> list[StackSample]:
    feeder = (
        "Thread._bootstrap (threading.py:1002)",
        "Thread.run (threading.py:982)",
        "Queue._feed (multiprocessing/queues.py:239)",
    )
    return [
        sample(*LOOP, *NEXT, count=40),  # the main process: not a worker
        worker(
            *FORK,
            *FETCH,
            "Transform.forward (torchvision/transforms/v2/_transform.py:69)",
            "pil_to_tensor (torchvision/transforms/functional.py:209)",
            "Image.tobytes (PIL/Image.py:879)",
            "ImageFile.load (PIL/ImageFile.py:425)",
            count=60,
        ),
        worker(
            *FORK,
            *FETCH,
            "resize_image (torchvision/transforms/v2/functional/_geometry.py:344)",
            "interpolate (torch/nn/functional.py:5257)",
            count=20,
        ),
        worker(
            *FORK,
            "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:57)",
            "default_collate (torch/utils/data/_utils/collate.py:401)",
            "collate_tensor_fn (torch/utils/data/_utils/collate.py:273)",
            count=10,
        ),
        worker(*feeder, "ForkingPickler.dumps (multiprocessing/reduction.py:51)", count=5, thread="3"),
        worker(*FORK, *FETCH, "open (PIL/Image.py:3500)", count=3),
        worker(*FORK, *FETCH, count=2),  # the dataset's own code, no library frame inside
        worker(
            *FORK, "Queue.get (multiprocessing/queues.py:122)", "_PollLikeSelector.select (selectors.py:415)", count=100
        ),
        worker(*feeder, "Condition.wait (threading.py:327)", count=50, thread="4"),
        worker(*FORK, *NEXT[2:], count=50, pid=3),  # a second worker, idle throughout
    ]


def test_worker_attribution_known_counts() -> None:
    att = attribute_workers(known_workers(), rate_hz=10)
    assert att.worker_pids == (2, 3) and att.roles is not None and att.roles.main_pid == 1
    assert (att.samples, att.idle, att.active, att.busy_seconds) == (300, 200, 100, 10.0)
    got = {c: att.shares[c].count for c in CATEGORIES}
    assert got == {"file_read": 3, "decode": 60, "augment": 20, "collate": 10, "ipc_pickling": 5, "other": 2}
    dec = att.shares["decode"]
    assert dec.fraction == 0.60 and dec.low < 0.60 < dec.high
    top = att.top["decode"][0]
    assert (top.function, top.count, top.of_category, top.of_active) == (
        "ImageFile.load (PIL/ImageFile.py)",
        60,
        1.0,
        0.6,
    )
    assert att.top["augment"][0].function.startswith("resize_image (torchvision/")
    assert att.top["other"][0].function == "MyDataset.__getitem__ (ds.py)"
    assert headline(att) == "60% of worker CPU is image decode: consider DALI (decode on the GPU) or smaller images"


def test_a_busy_worker_sample_without_a_python_frame_is_left_out_of_the_shares() -> None:
    # beside busy processes py-spy read no stack for some busy samples of a worker that only augments; counted
    # as "other", "(no Python frame)" became that worker's top loader frame (tests/test_zerocode_ranks.py)
    unread = worker(count=70)
    assert not unread.frames and not unread.idle
    att = attribute_workers([*known_workers(), unread], rate_hz=10)
    assert (att.samples, att.idle, att.active) == (370, 200, 100)
    assert att.shares["other"].count == 2 and att.shares["decode"].fraction == 0.60
    assert all(t.function != "(no Python frame)" for top in att.top.values() for t in top)
    assert "70 busy worker sample(s) with no Python frame (py-spy read no stack): not in the shares" in att.notes


def test_worker_rule_details() -> None:
    cat, frame = classify_worker_frames(stack(*FORK, "_worker_loop (torch/utils/data/_utils/worker.py:393)"))
    assert cat == "ipc_pickling"  # worker.py counts only while its own line runs (a C-level queue call)
    assert classify_worker_frames(stack(*FORK, *FETCH))[0] == "other"  # worker.py further out does not
    assert classify_worker_frames(stack(*FORK, *FETCH, "decode_known (ds.py:5)"))[0] == "decode"
    assert classify_worker_frames(stack(*FORK, *FETCH, "read_bytes (ds.py:5)"))[0] == "file_read"
    assert classify_worker_frames(stack(*FORK, *FETCH, "decode_jpeg (torchvision/io/image.py:9)"))[0] == "decode"
    assert classify_worker_frames(stack(*FORK, *FETCH, "read_file (torchvision/io/image.py:9)"))[0] == "file_read"
    assert (
        classify_worker_frames(stack(*FORK, *FETCH, "Compose.__call__ (albumentations/core/composition.py:9)"))[0]
        == "augment"
    )
    assert classify_worker_frames(stack(*FORK, *FETCH, "load (numpy/lib/_npyio_impl.py:9)"))[0] == "file_read"
    assert classify_worker_frames(stack(*FORK, *FETCH, "_dumps (pickle.py:9)"))[0] == "ipc_pickling"
    assert frame is not None and frame.name == "_worker_loop"


def test_headline_thresholds_and_texts() -> None:
    def att_for(counts: dict[str, int]) -> str | None:
        frames = {
            "augment": ("Compose.forward (torchvision/transforms/v2/_container.py:52)",),
            "collate": ("collate (torch/utils/data/_utils/collate.py:155)",),
            "other": (),
        }
        samples = [sample(*LOOP, count=1)]
        samples += [worker(*FORK, *FETCH, *frames[c], count=k) for c, k in counts.items()]
        return headline(attribute_workers(samples))

    assert att_for({"augment": 49, "collate": 51}) == (
        "51% of worker CPU is batch collation: consider fixed-size tensors or a simpler collate_fn"
    )
    assert att_for({"augment": 49, "collate": 49, "other": 2}) is None
    assert att_for({"augment": 20}) is None  # too few samples to say
    assert att_for({"other": 40}) == (
        "100% of worker CPU is in the data set's own code, mostly MyDataset.__getitem__ (ds.py): profile __getitem__"
    )


def test_find_copy_sites() -> None:
    src = textwrap.dedent(
        """
        for xb, yb in loader:
            x = xb.to(device, non_blocking=True)
            y = yb.cuda()
            z = (
                xb
                .to(
                    device)
            )
            w = xb.float()
        """
    )
    assert find_copy_sites(src, "train.py") == {("train.py", n) for n in (3, 4, 6, 7, 8)}
    assert ("train_jpeg.py", 70) in SCRIPT_SITES and ("train_jpeg.py", 71) in SCRIPT_SITES
    with pytest.raises(ValueError, match=r"cannot parse bad\.py"):
        find_copy_sites("def (:\n", "bad.py")


def test_phase_and_category_names() -> None:
    assert PHASES == ("data_wait", "h2d", "compute", "other")
    assert CATEGORIES == ("file_read", "decode", "augment", "collate", "ipc_pickling", "other")


# --- one real run --------------------------------------------------------------------------------------------

E2E_SCRIPT = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset

def decode_known(i):
    # a pure-Python CPU burn of known cost, named as a decoder would be
    acc = 0
    for k in range(40000):
        acc += (k * i) % 7
    return acc

class Burn(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        return torch.tensor([float(decode_known(i))])

def main():
    model = torch.nn.Linear(1, 1)
    t0 = time.monotonic()
    for xb in DataLoader(Burn(), batch_size=4, num_workers=2):
        model(xb).sum().backward()
        if time.monotonic() - t0 > float(sys.argv[1]):
            break

if __name__ == "__main__":
    main()
"""


def test_end_to_end_pyspy_attributes_known_decode(tmp_path: Path) -> None:
    pyspy = Path(sys.executable).with_name("py-spy")
    if not pyspy.exists():
        pytest.skip(f"py-spy not installed beside {sys.executable}")
    script = tmp_path / "burn.py"
    script.write_text(E2E_SCRIPT)
    out = tmp_path / "out.txt"
    cmd = [str(pyspy), "record", "--subprocesses", "--idle", "--threads", "--rate", "50", "--format", "raw"]
    cmd += ["-o", str(out), "--", sys.executable, str(script), "2.5"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if not out.exists():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        if any(w in " ".join(tail) for w in ("ermission", "ptrace", "not permitted")):
            pytest.skip(f"py-spy cannot sample here: {' '.join(tail)}")
        pytest.fail(f"py-spy wrote nothing (rc {proc.returncode}): {' '.join(tail)}")
    samples, st = parse_collapsed_stats(out.read_text())
    assert st.bad_records == 0 and st.samples > 0
    att = attribute_workers(samples, rate_hz=50)
    assert len(att.worker_pids) == 2
    assert att.top["decode"][0].function == "decode_known (burn.py)"
    assert att.shares["decode"].fraction > 0.6
    assert (headline(att) or "").endswith(
        "of worker CPU is image decode: consider DALI (decode on the GPU) or smaller images"
    )
    est = classify_main([samples], rate_hz=50)
    # two workers burn both cores while the loop's own work is a 1x1 Linear: the main thread mostly waits
    assert max(est.overall.shares.items(), key=lambda kv: kv[1].count)[0] == "data_wait"
