"""TensorBoard: scalar events in the log directory given (``tensorboard:DIR``).

Where torch is already imported (the training process) through ``torch.utils.tensorboard.SummaryWriter``'s
``add_scalar`` (never ``add_scalars``, which writes one directory per key) and ``add_text``; elsewhere (the
sampler process, ``report --to``) through tensorboard's own ``EventFileWriter``, the writer SummaryWriter wraps,
with the same Event records: importing torch there would cost seconds of CPU for nothing. TensorBoard keeps no
artifacts: the HTML report is not written here. A directory that already holds the user's own event files takes
ours beside them (TensorBoard reads every event file of a directory).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from profiler.trackers.analysis import Point


class TensorBoardTracker:
    name = "tensorboard"

    def __init__(self, logdir: str) -> None:
        Path(logdir).mkdir(parents=True, exist_ok=True)  # an unwritable directory fails here, when opened
        self.logdir = logdir
        self._w: Any = SummaryWriterOut(logdir) if "torch" in sys.modules else EventsOut(logdir)

    def log(self, points: Sequence[Point]) -> None:
        for p in points:
            self._w.add_scalar(p.name, p.value, p.step)
        self._w.flush()

    def log_summary(self, figures: Mapping[str, float], step: int) -> None:
        for name, value in figures.items():
            self._w.add_scalar(name, value, step)
        self._w.flush()

    def log_text(self, name: str, text: str) -> None:
        self._w.add_text(name, text)
        self._w.flush()

    def log_artifact(self, path: Path) -> None:
        pass  # TensorBoard keeps no artifacts

    def close(self) -> None:
        self._w.close()


class SummaryWriterOut:
    """torch's SummaryWriter (add_scalar, add_text)."""

    def __init__(self, logdir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._w = SummaryWriter(log_dir=logdir)

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        self._w.add_scalar(tag, value, step)

    def add_text(self, tag: str, text: str) -> None:
        self._w.add_text(tag, text)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()


class EventsOut:
    """tensorboard's EventFileWriter with the events SummaryWriter's add_scalar and add_text write."""

    def __init__(self, logdir: str) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._w = EventFileWriter(logdir)

    def _add(self, value: Any, step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._w.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._add(Summary.Value(tag=tag, simple_value=float(value)), step)

    def add_text(self, tag: str, text: str) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto

        plugin = SummaryMetadata.PluginData(plugin_name="text")
        tensor = TensorProto(
            dtype=7,  # DT_STRING
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        meta = SummaryMetadata(plugin_data=plugin)
        self._add(Summary.Value(tag=tag + "/text_summary", metadata=meta, tensor=tensor), 0)

    def flush(self) -> None:
        self._w.flush()

    def close(self) -> None:
        self._w.close()
