"""ledger/cost/layout.py: the fast framing learned from a template message agrees with pyarrow on real bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ledger.cost.layout import frame, index_valid, layout
from ledger.cost.record import LATEST
from ledger.cost.scan import message_length
from ledger.cost.store import Ledger

COMMON = {"kind": "train", "arm": "baseline", "gpus": 0, "host": "ab" * 32, "protocol_id": "cd" * 32}


def _pyarrow_starts(data: bytes) -> tuple[int, list[int]]:
    """Where each message starts, read message by message by pyarrow: (schema length, record starts)."""
    pos = message_length(data, 0, len(data))
    assert pos is not None
    schema_len, starts = pos, []
    while pos < len(data):
        n = message_length(data, pos, len(data))
        assert n is not None
        starts.append(pos)
        pos += n
    return schema_len, starts


def test_framing_finds_the_record_messages_pyarrow_finds(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.arrows")
    for i in range(5):  # run ids and notes of different lengths: messages of different sizes
        ledger.append(run_id="r" * (i + 1), package="train-A", status="ok", note="n" * (7 * i), **COMMON)
    data = (tmp_path / "ledger.arrows").read_bytes()
    lay = layout(LATEST)
    assert lay is not None and lay.body_at == 8 + lay.meta_len
    schema_len, expected = _pyarrow_starts(data)
    starts, stop = frame(data, schema_len, len(data), lay)
    assert starts.tolist() == expected and stop == len(data)
    assert index_valid(data, len(data), starts, schema_len, lay)
    assert not index_valid(data, len(data), starts + 8, schema_len, lay)  # an index off by one word
    assert index_valid(data, len(data), np.asarray([], dtype=np.int64), schema_len, lay)


def test_framing_stops_before_a_torn_message(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.arrows")
    for _ in range(3):
        ledger.append(run_id="r1", package="checks", status="open", **COMMON)
    data = (tmp_path / "ledger.arrows").read_bytes()
    lay = layout(LATEST)
    assert lay is not None
    schema_len, expected = _pyarrow_starts(data)
    starts, stop = frame(data[:-3], schema_len, len(data) - 3, lay)
    assert starts.tolist() == expected[:2] and stop == expected[2]
