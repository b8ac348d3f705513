"""Reading a ledger file's bytes: its record version, the spans of its complete messages, one record decoded.

Shared by the store (append, read, repair) and the verifier; nothing here writes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ledger.cost.layout import frame, layout
from ledger.cost.record import LATEST, VERSIONS, schema_message, schema_of
from protocol.errors import FailedError

# what pyarrow and the decoding below raise on bytes that are not a ledger record
# OverflowError: a flipped byte can put a timestamp out of datetime's range (found by test_ledger_store's property test)
UNPARSEABLE = (pa.ArrowException, OSError, ValueError, EOFError, KeyError, TypeError, IndexError, OverflowError)


@dataclass(frozen=True)
class Scan:
    """The messages of a ledger file: their spans, where parsing stopped, and any schema problem."""

    spans: list[tuple[int, int]]
    end: int  # first byte not part of a complete message
    schema_problem: str | None
    version: int = LATEST


def file_version(buf: Any, size: int) -> int:
    """The record version of a ledger file from its schema message (the latest for an empty file)."""
    for version in VERSIONS:
        msg = schema_message(version)
        if size >= len(msg) and bytes(buf[: len(msg)]) == msg:
            return version
    return LATEST


def decode_message(raw: Any, version: int = LATEST) -> dict[str, Any]:
    """One record message decoded by pyarrow into a row dict; raises on anything else."""
    msg = pa.ipc.read_message(pa.py_buffer(raw))
    if msg is None or msg.type != "record batch" or len(msg.serialize()) != len(raw):
        raise ValueError("not one complete record batch message")
    batch = pa.ipc.read_record_batch(msg, schema_of(version))
    batch.validate(full=True)
    if batch.num_rows != 1:
        raise ValueError(f"a record batch of {batch.num_rows} rows")
    row: dict[str, Any] = batch.to_pylist()[0]
    return row


def message_length(buf: Any, pos: int, end: int) -> int | None:
    """Length of the complete IPC message at pos, or None when the bytes there are not one."""
    try:
        reader = pa.BufferReader(pa.py_buffer(buf[pos:end]))
        msg = pa.ipc.read_message(reader)
    except UNPARSEABLE:
        return None
    if msg is None:
        return None
    return int(reader.tell())


def scan_messages(buf: Any, size: int) -> Scan:
    """Frame every complete record message; fast framing first, then pyarrow from where it stopped."""
    if size == 0:
        return Scan([], 0, None)
    schema_len = message_length(buf, 0, size)
    if schema_len is None:
        return Scan([], 0, "the schema message does not parse")
    problem = None
    version = LATEST
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(buf[:schema_len]))
        known = [v for v in VERSIONS if schema.equals(schema_of(v), check_metadata=True)]
        if known:
            version = known[0]
        else:
            problem = "the file's Arrow schema is not the ledger schema"
    except UNPARSEABLE:
        problem = "the schema message does not parse"
    spans: list[tuple[int, int]] = []
    pos = schema_len
    lay = layout(version)
    if lay is not None and problem is None:
        starts = frame(buf, pos, size, lay)[0].tolist()
        # the last framed message may be torn inside: only trust the ones followed by another
        spans = list(itertools.pairwise(starts))
        if spans:
            pos = spans[-1][1]
    while pos < size:
        n = message_length(buf, pos, size)
        if n is None:
            break
        try:
            decode_message(buf[pos : pos + n], version)
        except UNPARSEABLE:
            break
        spans.append((pos, pos + n))
        pos += n
    return Scan(spans, pos, problem, version)


def decode_or_fail(buf: Any, start: int, end: int, seq: int, version: int) -> dict[str, Any]:
    try:
        return decode_message(buf[start:end], version)
    except UNPARSEABLE as err:
        raise FailedError(f"ledger record {seq} does not decode ({err}); run `orch ledger verify`") from err
