"""Progress of a long preparation step (generating a data set): a rich bar on a terminal, plain lines elsewhere.

``progress(label)`` is a context manager yielding a ``(done, total)`` callback, the shape
``scenarios.datagen.make`` reports through. Off a TTY it prints one line per 10 % so logs stay short.
Everything goes to stderr: stdout is kept for the report or the JSON.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

Callback = Callable[[int, int], None]


@contextmanager
def progress(label: str, stream: TextIO | None = None) -> Iterator[Callback]:
    out = stream if stream is not None else sys.stderr
    if out.isatty():
        console = Console(file=out)
        with Progress(
            TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
        ) as bar:
            task = bar.add_task(label, total=None)

            def update(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield update
        return

    state = {"next": 0.0, "t0": time.monotonic()}

    def line(done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if frac >= state["next"]:  # the last line too (frac 1.0), once: then "next" is past it
            out.write(f"{label}: {done}/{total} ({frac:.0%}, {time.monotonic() - state['t0']:.0f} s)\n")
            out.flush()
            state["next"] = min(1.0, (int(frac * 10) + 1) / 10)
            if done == total:
                state["next"] = 2.0  # printed the last line once

    yield line
