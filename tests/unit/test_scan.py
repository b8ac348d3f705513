"""ledger/cost/scan.py on a real ledger file's bytes: complete messages framed, a torn tail left out, junk named."""

from __future__ import annotations

from pathlib import Path

import pytest

from ledger.cost.record import LATEST
from ledger.cost.scan import Scan, decode_message, decode_or_fail, file_version, scan_messages
from ledger.cost.store import Ledger
from protocol.errors import FailedError

COMMON = {"kind": "train", "arm": "baseline", "gpus": 0, "host": "ab" * 32, "protocol_id": "cd" * 32}


def _ledger_bytes(tmp_path: Path, n: int) -> bytes:
    ledger = Ledger(tmp_path / "ledger.arrows")
    for i in range(n):
        ledger.append(run_id=f"r{i}", package="train-A", status="open", **COMMON)
    return (tmp_path / "ledger.arrows").read_bytes()


def test_every_complete_record_is_framed_and_decodes(tmp_path: Path) -> None:
    data = _ledger_bytes(tmp_path, 3)
    scan = scan_messages(data, len(data))
    assert (len(scan.spans), scan.end, scan.schema_problem, scan.version) == (3, len(data), None, LATEST)
    assert file_version(data, len(data)) == LATEST
    rows = [decode_message(data[a:b], scan.version) for a, b in scan.spans]
    assert [(r["seq"], r["run_id"], r["status"]) for r in rows] == [(0, "r0", "open"), (1, "r1", "open"),
                                                                     (2, "r2", "open")]
    assert scan.spans[0][0] > 0 and all(b == c for (_, b), (c, _) in zip(scan.spans, scan.spans[1:], strict=False))


def test_a_torn_last_record_is_not_a_record(tmp_path: Path) -> None:
    data = _ledger_bytes(tmp_path, 3)
    whole = scan_messages(data, len(data))
    torn = data[:-10]
    scan = scan_messages(torn, len(torn))
    assert scan.spans == whole.spans[:2] and scan.end == whole.spans[2][0] and scan.schema_problem is None


def test_an_empty_file_and_junk_bytes(tmp_path: Path) -> None:
    assert scan_messages(b"", 0) == Scan([], 0, None)
    junk = b"this is not an Arrow stream" * 4
    assert scan_messages(junk, len(junk)) == Scan([], 0, "the schema message does not parse")


def test_a_span_that_is_not_one_record_fails_in_one_line(tmp_path: Path) -> None:
    data = _ledger_bytes(tmp_path, 2)
    (a, _), (_, d) = scan_messages(data, len(data)).spans
    with pytest.raises(ValueError):
        decode_message(data[a:d])  # two messages are not one
    with pytest.raises(FailedError, match=r"^ledger record 7 does not decode \(.*\); run `orch ledger verify`$"):
        decode_or_fail(data, a, a + 16, 7, LATEST)
