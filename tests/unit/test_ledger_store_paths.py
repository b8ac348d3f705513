"""The ledger store's reading paths and locks (ledger.cost.store.Ledger): records, hashes, orphans, version and
columns on the fast (framed) path and on the pyarrow fallback, a version 1 file, and repair under the exclusive lock.

Expected values come from what append returned and from the version 1 fixture's known contents.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ledger.cost import store as store_mod
from ledger.cost.record import LedgerRecord, fields_of
from ledger.cost.store import Ledger

REPO = Path(__file__).resolve().parents[2]
V1 = REPO / "tests" / "fixtures" / "ledger_v1.arrows"


def _fields(run: str, package: str, status: str) -> dict[str, Any]:
    return {"run_id": run, "package": package, "kind": "train" if package.startswith("train") else "checks",
            "status": status, "protocol_id": "p1", "started": "2026-01-02T03:04:05Z"}


def _fill(ledger: Ledger) -> list[LedgerRecord]:
    return [ledger.append(**_fields(run, pkg, status)) for run, pkg, status in [
        ("r1", "checks", "open"), ("r2", "checks", "open"), ("r1", "checks", "ok"), ("r1", "train-A", "open"),
        ("r2", "checks", "failed")]]


@pytest.fixture(params=["framed", "fallback"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    if request.param == "fallback":  # a pyarrow whose message layout orch does not know: every read is decoded
        monkeypatch.setattr(store_mod, "layout", lambda version=2: None)
    return Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)


def test_records_and_their_hashes_are_what_was_appended_in_order(ledger: Ledger) -> None:
    appended = _fill(ledger)
    assert ledger.records() == appended
    assert ledger.records("r1") == [appended[0], appended[2], appended[3]]
    assert ledger.records("r2") == [appended[1], appended[4]]
    assert ledger.records("none") == []
    assert ledger.record_hashes() == [bytes.fromhex(r.record_hash) for r in appended]
    assert [r.seq for r in appended] == [0, 1, 2, 3, 4]


def test_orphans_are_the_open_records_never_closed_in_ledger_order(ledger: Ledger) -> None:
    assert ledger.orphans() == []
    _fill(ledger)
    assert ledger.orphans() == [("r1", "train-A")]
    ledger.append(**_fields("r3", "train-B", "open"))
    assert ledger.orphans() == [("r1", "train-A"), ("r3", "train-B")]
    ledger.append(**_fields("r1", "train-A", "ok"))
    assert ledger.orphans() == [("r3", "train-B")]


def test_a_ledger_not_yet_written_reads_as_the_latest_version(ledger: Ledger) -> None:
    assert ledger.version() == 2
    assert ledger.column_names() == [n for n, _ in fields_of(2)] and "user" in ledger.column_names()
    assert ledger.records() == [] and ledger.record_hashes() == [] and ledger.orphans() == []
    assert not ledger.path.exists()


def test_a_version_1_ledger_keeps_its_version_columns_and_records(tmp_path: Path, ledger: Ledger) -> None:
    path = ledger.path
    path.parent.mkdir(parents=True)
    shutil.copy(V1, path)
    assert ledger.version() == 1
    assert ledger.column_names() == [n for n, _ in fields_of(1)] and "user" not in ledger.column_names()
    old = ledger.records()
    assert len(old) == 5 and all(type(r) is LedgerRecord for r in old)
    assert old[3].started == "2026-01-02T03:04:10Z"  # version 1's own time format: seconds without a fraction
    assert ledger.record_hashes() == [bytes.fromhex(r.record_hash) for r in old]
    new = ledger.append(**_fields("r9", "checks", "open"))
    assert type(new) is LedgerRecord and new.seq == 5 and new.prev_hash == old[-1].record_hash
    assert new.started == "2026-01-02T03:04:05Z"
    assert ledger.records("r9") == [new] and ledger.version() == 1 and ledger.verify().ok
    again = ledger.append(**_fields("r9", "checks", "ok"))  # from the tail hint the first append wrote
    assert type(again) is LedgerRecord and again.seq == 6 and again.prev_hash == new.record_hash
    assert ledger.verify().ok and len(ledger.records()) == 7


def _held_shared(ledger: Ledger) -> int:
    ledger.path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(ledger.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_SH)  # what a reader holds while it maps the file
    return fd


@pytest.mark.parametrize("action", ["repair", "append"])
def test_repair_and_append_wait_for_a_reader_to_let_go(tmp_path: Path, action: str) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    ledger.append(**_fields("r1", "checks", "open"))
    fd = _held_shared(ledger)
    done = threading.Event()

    def act() -> None:
        if action == "repair":
            ledger.repair()
        else:
            ledger.append(**_fields("r1", "checks", "ok"))
        done.set()

    worker = threading.Thread(target=act)
    worker.start()
    try:
        time.sleep(0.5)
        assert not done.is_set(), f"{action} went ahead under a reader's shared lock"
    finally:
        os.close(fd)  # closing the descriptor releases the reader's lock
    worker.join(timeout=30)
    assert done.is_set() and len(ledger.records()) == (1 if action == "repair" else 2)


def test_the_table_holds_the_complete_records_columns(ledger: Ledger) -> None:
    empty = ledger.table(["seq", "status"])
    assert empty.num_rows == 0 and empty.column_names == ["seq", "status"]
    assert ledger.table().column_names == [n for n, _ in fields_of(2)]
    appended = _fill(ledger)
    table = ledger.table(["seq", "run_id", "status"])
    assert table.column_names == ["seq", "run_id", "status"]
    assert table.to_pydict() == {"seq": [0, 1, 2, 3, 4], "run_id": [r.run_id for r in appended],
                                 "status": [r.status for r in appended]}
    assert ledger.table(["run_id"], dictionary=True)["run_id"].to_pylist() == [r.run_id for r in appended]
    assert ledger.table()["record_hash"].to_pylist() == [r.record_hash for r in appended]


def test_a_torn_tail_leaves_the_complete_records_readable(ledger: Ledger) -> None:
    appended = _fill(ledger)
    with ledger.path.open("ab") as f:
        f.write(b"\xff\xff\xff\xff\x10\x00\x00\x00half a record")
    assert ledger.table(["seq", "status"]).to_pydict() == {"seq": [0, 1, 2, 3, 4],
                                                          "status": [r.status for r in appended]}
    assert ledger.records() == appended and ledger.record_hashes() == [bytes.fromhex(r.record_hash) for r in appended]


def test_a_version_1_table_has_version_1_columns_and_types(ledger: Ledger) -> None:
    ledger.path.parent.mkdir(parents=True)
    shutil.copy(V1, ledger.path)
    table = ledger.table()
    assert table.column_names == [n for n, _ in fields_of(1)] and table.num_rows == 5
    assert str(table.schema.field("started").type) == "string"
    assert table["started"][3].as_py() == "2026-01-02T03:04:10Z"


def test_a_good_ledger_verifies_on_the_fast_path_and_reports_its_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    _fill(ledger)

    def slow(*_: Any) -> Any:
        raise AssertionError("a ledger that verifies took the record-by-record path")

    monkeypatch.setattr(store_mod, "verify_slow", slow)
    report = ledger.verify()
    assert report.ok and report.size == 5 and report.bytes == ledger.path.stat().st_size
    assert report.orphaned == [("r1", "train-A")]


def test_a_truncation_keeps_an_earlier_first_bad_seq(tmp_path: Path) -> None:
    from ledgerutil import offsets

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    appended = _fill(ledger)
    data = bytearray(ledger.path.read_bytes()[: offsets(ledger.path)[4]])  # record 4 cut off: 5 appended, 4 left
    at = data.index(appended[1].record_hash.encode(), offsets(ledger.path)[1])  # inside record 1's own columns
    data[at] = ord("0") if data[at] != ord("0") else ord("1")
    ledger.path.write_bytes(bytes(data))
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 1 and report.bytes == len(data)
    assert "truncated: 5 records were appended but 4 complete records remain" in report.problems


def test_a_good_ledger_is_read_through_its_framed_columns_not_message_by_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    appended = _fill(ledger)

    def scan(*_: Any) -> Any:
        raise AssertionError("a framed ledger was scanned message by message")

    monkeypatch.setattr(store_mod, "scan_messages", scan)
    assert ledger.records() == appended and ledger.records("r2") == [appended[1], appended[4]]
    assert ledger.record_hashes() == [bytes.fromhex(r.record_hash) for r in appended]
    assert ledger.table(["seq"])["seq"].to_pylist() == [0, 1, 2, 3, 4]


def test_a_ledger_that_does_not_extend_a_head_says_so(tmp_path: Path) -> None:
    from ledger.cost.merkle import TreeHead

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    _fill(ledger)
    wrong = TreeHead(size=3, root="ab" * 32)
    report = ledger.verify(against=wrong)
    assert not report.ok and report.problems == [
        f"not an extension of tree head {wrong}: the ledger has 5 records and no consistency proof to that head "
        "verifies"]


def test_append_fills_host_and_user_only_when_the_caller_gives_none(tmp_path: Path) -> None:
    from ledger.cost.record import login_name

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    given = ledger.append(**_fields("r1", "checks", "open"), host="c" * 64, user="alice")
    assert given.host == "c" * 64 and given.user == "alice"  # type: ignore[attr-defined]
    filled = ledger.append(**_fields("r1", "checks", "ok"))
    assert filled.host == ledger.host_hash() and filled.user == login_name()  # type: ignore[attr-defined]


def test_a_new_ledger_file_is_rw_for_its_owner_and_read_only_for_others(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
        ledger.append(**_fields("r1", "checks", "open"))
    finally:
        os.umask(old)
    assert ledger.path.stat().st_mode & 0o777 == 0o644


def test_the_tail_hint_names_the_size_the_last_records_offset_and_the_count(tmp_path: Path) -> None:
    import json

    from ledgerutil import offsets

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    _fill(ledger)
    assert json.loads(ledger.tail_path.read_text()) == {"size": ledger.path.stat().st_size,
                                                        "offset": offsets(ledger.path)[-1], "records": 5}


def test_verify_names_at_most_20_problems_the_first_ones_first(tmp_path: Path) -> None:
    from ledgerutil import offsets

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    for i in range(25):
        ledger.append(**_fields(f"r{i}", "checks", "open"))
    data = ledger.path.read_bytes()
    starts = offsets(ledger.path)
    ledger.path.write_bytes(data[: starts[0]] + data[starts[1]:])  # record 0 cut out: every later seq is one off
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 0 and len(report.problems) == 20
    assert report.problems[0] == "seq 0: seq field is 1, expected 0 (records reordered, lost or inserted)"


def test_an_append_reads_only_the_last_record_named_by_the_tail_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    appended = _fill(ledger)

    def scan(*_: Any) -> Any:
        raise AssertionError("an append with a valid tail hint scanned the whole ledger")

    monkeypatch.setattr(store_mod, "scan_messages", scan)
    new = ledger.append(**_fields("r1", "train-A", "ok"))
    assert new.seq == 5 and new.prev_hash == appended[-1].record_hash
    monkeypatch.undo()
    assert ledger.verify().ok


def test_the_offset_index_holds_every_records_start(tmp_path: Path) -> None:
    import numpy as np
    from ledgerutil import offsets

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    _fill(ledger)
    assert np.fromfile(ledger.index_path, dtype="<i8").tolist() == offsets(ledger.path)


@pytest.mark.parametrize("truncate_fails", [False, True])
def test_a_failed_write_says_whether_the_ledger_was_left_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, truncate_fails: bool
) -> None:
    import errno

    from protocol.errors import FailedError

    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    _fill(ledger)
    size = ledger.path.stat().st_size

    def full(*_: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def cannot(*_: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(store_mod.os, "pwrite", full)
    if truncate_fails:
        monkeypatch.setattr(store_mod.os, "ftruncate", cannot)
    with pytest.raises(FailedError) as err:
        ledger.append(**_fields("r1", "train-A", "ok"))
    state = "NOT restored; run `orch ledger verify`" if truncate_fails else f"left as it was ({size} bytes)"
    assert err.value.message == (f"ledger write failed (No space left on device); the ledger is {state}; "
                                 "free disk space or fix permissions and retry")
    monkeypatch.setattr(store_mod.os, "pwrite", lambda *_: (_ for _ in ()).throw(OSError("plain failure")))
    with pytest.raises(FailedError, match=r"^ledger write failed \(plain failure\); "):
        ledger.append(**_fields("r1", "train-A", "ok"))
