"""Reads a W&B run file (``run-ID.wandb``) back: wandb 0.31 has no reader of its own in Python (the internal
datastore reader left with the Go core), and an offline run writes no ``files/wandb-summary.json``, so the
tests read the file's records here, with wandb's own protobuf schema (``wandb.proto.wandb_internal_pb2.Record``).

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic 0xBEE1, version 0), then records in 32 KiB
blocks, each chunk with a 7-byte header (CRC-32, length, type: full / first / middle / last).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
CHUNK = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    ident, magic, version = HEADER.unpack_from(data, 0)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), (ident, magic, version)
    out, pos, parts = [], HEADER.size, b""
    while pos + CHUNK.size <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK.size:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _, length, kind = CHUNK.unpack_from(data, pos)
        if kind == 0 and length == 0:
            pos += left
            continue
        body = data[pos + CHUNK.size : pos + CHUNK.size + length]
        pos += CHUNK.size + length
        parts = body if kind in (FULL, FIRST) else parts + body
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(parts)
            out.append(rec)
    return out


def history(path: Path) -> list[dict[str, Any]]:
    """Each ``log()`` call's row: key -> value."""
    rows = []
    for rec in records(path):
        if rec.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item}
            )
    return rows


def summary(path: Path) -> dict[str, Any]:
    """The run's summary as its last summary records left it."""
    out: dict[str, Any] = {}
    for rec in records(path):
        if rec.WhichOneof("record_type") == "summary":
            for item in rec.summary.update:
                out[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return out
