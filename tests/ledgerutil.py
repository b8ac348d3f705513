"""Helpers shared by the ledger tests: where each record message starts, found with pyarrow alone."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def offsets(path: Path) -> list[int]:
    """Start offsets of the record messages, found with pyarrow alone (independent of orch's framing)."""
    data = path.read_bytes()
    reader = pa.BufferReader(pa.py_buffer(data))
    pa.ipc.read_message(reader)  # schema
    starts = []
    while reader.tell() < len(data):
        starts.append(reader.tell())
        pa.ipc.read_message(reader)
    return starts
