"""Reading a torch.profiler (kineto) trace file: ``.json`` or ``.json.gz``, as the profiler's
``tensorboard_trace_handler`` and ``export_chrome_trace`` write it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class TraceError(ValueError):
    """The file is not a trace this can read: the message names it and says why."""


def read_trace(path: str | Path) -> dict[str, object]:
    """The trace's JSON object (``traceEvents`` and the rest); TraceError for a missing, unreadable or foreign file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except (OSError, EOFError) as exc:
        raise TraceError(f"{p}: cannot read it ({exc})") from None
    except ValueError as exc:
        raise TraceError(f"{p}: not a JSON trace ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{p}: not a torch.profiler trace (no traceEvents list)")
    return data
