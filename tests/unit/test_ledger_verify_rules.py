"""The verifier's own rules, each on its own: the record-by-record pass's words and seqs, and the sharing of the fast
pass's hashing chunks with a forked child (both processes take chunks, a bad chunk stops both, the child is reaped)."""

from __future__ import annotations

import hashlib
import mmap
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from ledger.cost import record as record_module
from ledger.cost import verify
from ledger.cost.record import GENESIS, LedgerRecord, record_hash_of, record_message, schema_message, schema_of, seal
from ledger.cost.store import Ledger

BASE = {"run_id": "r", "package": "checks", "kind": "checks", "arm": None, "gpus": 1,
        "protocol_id": "b" * 64, "host": "a" * 64, "started": "2026-01-01T00:00:00Z"}


def _chain(n: int, version: int = 2, gpus_at: int | None = None) -> tuple[bytes, list[bytes]]:
    """The schema message and n chained record messages of that version; record `gpus_at` holds gpus = -1
    (re-sealed without validation: its hash and canonical JSON agree, only the schema refuses it)."""
    prev_hash, prev_message = GENESIS, hashlib.sha256(schema_message(version)).hexdigest()
    messages = []
    for seq in range(n):
        status = "open" if seq % 2 == 0 else "ok"
        record = seal({**BASE, "status": status, "seq": seq, "prev_hash": prev_hash,
                       "prev_message_sha256": prev_message}, version)
        if seq == gpus_at:
            record = record.model_copy(update={"gpus": -1})
            record = record.model_copy(update={"record_hash": record_hash_of(record.hashed_fields())})
        message = record_message(record)
        messages.append(message)
        prev_hash, prev_message = record.record_hash, hashlib.sha256(message).hexdigest()
    return schema_message(version), messages


def _altered(n: int, at: int, alter: Callable[[LedgerRecord], tuple[LedgerRecord, bytes]]) -> bytes:
    """A chain of n records whose record `at` is written as `alter` says: (the record the next one chains onto,
    its message bytes); the others are intact and chained."""
    prev_hash, prev_message = GENESIS, hashlib.sha256(schema_message()).hexdigest()
    data = schema_message()
    for seq in range(n):
        record = seal({**BASE, "status": "open", "seq": seq, "prev_hash": prev_hash,
                       "prev_message_sha256": prev_message})
        record, message = alter(record) if seq == at else (record, record_message(record))
        data += message
        prev_hash, prev_message = record.record_hash, hashlib.sha256(message).hexdigest()
    return data


def _problems(buf: bytes) -> tuple[list[str], int | None]:
    report, _, _ = verify.verify_slow(buf, len(buf))
    return report["problems"], report["first_bad_seq"]


def test_a_record_sealed_with_another_seq_is_named_with_both() -> None:
    def reseq(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        moved = seal({**record.hashed_fields(), "seq": 5})  # hash, canonical JSON and columns agree on seq 5
        return moved, record_message(moved)

    assert _problems(_altered(3, 1, reseq)) == (
        ["seq 1: seq field is 5, expected 1 (records reordered, lost or inserted)"], 1)


def test_a_column_that_differs_from_the_hashed_json_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def regpu(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        hashed = record_module.canonical_json(record.hashed_fields())
        with monkeypatch.context() as m:  # the canonical JSON (and its record_hash) as sealed, gpus 2 in its column
            m.setattr(record_module, "canonical_json", lambda fields: hashed)
            message = record_message(record.model_copy(update={"gpus": 2}))
        return record, message

    assert _problems(_altered(3, 1, regpu)) == (["seq 1: the columns differ from the record's canonical JSON"], 1)


def test_a_record_hash_that_is_not_the_digest_of_its_json_is_named() -> None:
    def rehash(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        forged = record.model_copy(update={"record_hash": "c" * 64})  # the next record chains onto it
        return forged, record_message(forged)

    assert _problems(_altered(3, 1, rehash)) == (["seq 1: record_hash is not the SHA256 of the canonical JSON"], 1)


@pytest.mark.parametrize("at", [1, 2])
def test_a_wrong_message_digest_in_a_record_names_the_message_before_it(at: int) -> None:
    def redigest(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        resealed = seal({**record.hashed_fields(), "prev_message_sha256": "d" * 64})  # in place, chained
        return resealed, record_message(resealed)

    assert _problems(_altered(3, at, redigest)) == (
        [f"seq {at - 1}: message bytes differ from what was appended (digest in record {at})"], at - 1)


@pytest.mark.parametrize("forged", ["not json", "[1]", "{}"])
def test_a_hashed_text_that_is_not_the_records_json_is_named_and_never_crashes_the_verifier(
        monkeypatch: pytest.MonkeyPatch, forged: str) -> None:
    """record_hash is the SHA256 of the canonical column, which is not a JSON object, or one without the digest:
    the columns differ from it, and the message digest is read from the column (which is right here)."""
    def reforge(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        hashed = record.model_copy(update={"record_hash": hashlib.sha256(forged.encode()).hexdigest()})
        with monkeypatch.context() as m:
            m.setattr(record_module, "canonical_json", lambda fields: forged)
            return hashed, record_message(hashed)

    assert _problems(_altered(3, 1, reforge)) == (["seq 1: the columns differ from the record's canonical JSON"], 1)


def _with_canonical(record: LedgerRecord, canonical: str, monkeypatch: pytest.MonkeyPatch, **columns: Any) -> bytes:
    """The message of `record` with these columns changed and this text in its canonical column."""
    with monkeypatch.context() as m:
        m.setattr(record_module, "canonical_json", lambda fields: canonical)
        return record_message(record.model_copy(update=columns))


def test_an_altered_digest_column_under_an_intact_json_blames_this_record_not_the_one_before(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def recolumn(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        intact = record_module.canonical_json(record.hashed_fields())  # its SHA256 is still the record_hash
        return record, _with_canonical(record, intact, monkeypatch, prev_message_sha256="d" * 64)

    assert _problems(_altered(3, 1, recolumn)) == (["seq 1: the columns differ from the record's canonical JSON"], 1)


def test_the_digest_in_a_json_that_its_hash_does_not_pin_is_not_believed(monkeypatch: pytest.MonkeyPatch) -> None:
    def rejson(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        other = record_module.canonical_json({**record.hashed_fields(), "prev_message_sha256": "d" * 64})
        return record, _with_canonical(record, other, monkeypatch)  # columns and record_hash as sealed

    assert _problems(_altered(3, 1, rejson)) == (["seq 1: the columns differ from the record's canonical JSON",
                                                  "seq 1: record_hash is not the SHA256 of the canonical JSON"], 1)


KEYS = pa.schema([("seq", pa.int64()), ("run_id", pa.string()), ("package", pa.string()), ("status", pa.string())])


def test_the_last_message_must_be_its_records_own_serialization() -> None:
    def v4(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        """The same record batch written with Arrow's older metadata version: it decodes to the same record."""
        batch = pa.ipc.read_record_batch(pa.ipc.read_message(record_message(record)), schema_of(2))
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(metadata_version=pa.ipc.MetadataVersion.V4)
        with pa.ipc.new_stream(sink, schema_of(2), options=options) as writer:
            writer.write_batch(batch)
        reader = pa.BufferReader(sink.getvalue())
        pa.ipc.read_message(reader)  # the schema
        start = reader.tell()
        pa.ipc.read_message(reader)
        message = sink.getvalue().to_pybytes()[start : reader.tell()]
        assert message != record_message(record)
        return record, message

    assert _problems(_altered(3, 2, v4)) == (["seq 2: the last message's bytes are not its record's serialization"], 2)


def test_a_torn_tail_is_named_with_its_bytes_and_offset() -> None:
    whole = _altered(3, -1, lambda record: (record, b""))
    buf = whole + record_message(seal({**BASE, "status": "ok", "seq": 3, "prev_hash": "e" * 64,
                                       "prev_message_sha256": "f" * 64}))[:100]
    report, hashes, keys = verify.verify_slow(buf, len(buf))
    assert report == {"ok": False, "size": 3, "first_bad_seq": 3, "torn_at": len(whole), "problems": [
        f"seq 3: torn tail: 100 bytes at offset {len(whole)} do not parse as a complete record; "
        "run `orch ledger repair` to move them aside"]}
    assert len(hashes) == 3 and keys.num_rows == 3


def test_problems_are_listed_in_seq_order_not_in_the_order_found() -> None:
    def both(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        bad = seal({**record.hashed_fields(), "prev_message_sha256": "d" * 64}).model_copy(update={"gpus": -1})
        bad = bad.model_copy(update={"record_hash": record_hash_of(bad.hashed_fields())})
        return bad, record_message(bad)  # found at record 1: its schema, then the message before it

    assert _problems(_altered(3, 1, both)) == (
        ["seq 0: message bytes differ from what was appended (digest in record 1)",
         "seq 1: schema: ('gpus',): Input should be greater than or equal to 0"], 0)


def test_the_slow_pass_gives_each_records_hash_and_keys() -> None:
    buf = _altered(3, -1, lambda record: (record, b""))
    report, hashes, keys = verify.verify_slow(buf, len(buf))
    assert report["ok"]
    records = [seal({**BASE, "status": "open", "seq": 0, "prev_hash": GENESIS,
                     "prev_message_sha256": hashlib.sha256(schema_message()).hexdigest()})]
    assert hashes[0] == bytes.fromhex(records[0].record_hash) and len(hashes) == 3
    assert keys.schema == KEYS
    assert keys.to_pylist() == [{"seq": i, "run_id": "r", "package": "checks", "status": "open"} for i in range(3)]


def test_a_record_hash_that_is_not_hex_is_left_out_of_the_hashes() -> None:
    def unhex(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        return record, record_message(record.model_copy(update={"record_hash": "z" * 64}))

    buf = _altered(3, 1, unhex)
    report, hashes, keys = verify.verify_slow(buf, len(buf))
    assert report["problems"][0].startswith("seq 1: schema: ('record_hash',): String should match pattern")
    assert len(hashes) == 2 and keys.num_rows == 3


def test_the_keys_of_an_empty_result_have_the_same_columns() -> None:
    buf = pa.schema([("x", pa.int64())]).serialize().to_pybytes()
    _, hashes, keys = verify.verify_slow(buf, len(buf))
    assert hashes == [] and keys.num_rows == 0 and keys.schema == KEYS


@pytest.mark.parametrize("chunk", [3, 4, 10])  # 4 chunks (shared with the child), 3 (this process alone), 1
def test_a_good_ledger_is_decided_by_the_vectorised_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         chunk: int) -> None:
    path = tmp_path / "ledger.arrows"
    path.write_bytes(_altered(10, -1, lambda record: (record, b"")))
    buf = path.read_bytes()
    with _only_children_exit(monkeypatch):
        fast = Ledger(path, verify_chunk=chunk)._verify_fast(buf, len(buf))
    assert fast is not None
    n, keys = fast
    assert n == 10 and keys.column("seq").to_pylist() == list(range(10))
    assert keys.column("status").to_pylist() == ["open"] * 10


@pytest.mark.parametrize("chunk", [2, 10])  # the bad record inside a chunk, or in the only one
def test_the_vectorised_pass_declines_a_record_sealed_with_another_seq(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       chunk: int) -> None:
    def reseq(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        moved = seal({**record.hashed_fields(), "seq": 5})  # hash, canonical JSON, columns and chain all agree
        return moved, record_message(moved)

    path = tmp_path / "ledger.arrows"
    path.write_bytes(_altered(10, 3, reseq))
    buf = path.read_bytes()
    with _only_children_exit(monkeypatch):
        assert Ledger(path, verify_chunk=chunk)._verify_fast(buf, len(buf)) is None
    report = Ledger(path, verify_chunk=chunk).verify()
    assert (report.ok, report.first_bad_seq) == (False, 3)


def test_a_ledger_of_no_records_is_decided_by_the_vectorised_pass_as_empty(tmp_path: Path) -> None:
    path = tmp_path / "ledger.arrows"
    path.write_bytes(schema_message())
    buf = path.read_bytes()
    fast = Ledger(path)._verify_fast(buf, len(buf))
    assert fast is not None and fast[0] == 0 and fast[1].num_rows == 0
    report = Ledger(path).verify()
    assert (report.ok, report.size) == (True, 0)


@pytest.mark.parametrize("field", ["prev_hash", "prev_message_sha256"])
def test_a_first_record_that_does_not_start_from_genesis_is_declined_by_both_passes(
        tmp_path: Path, field: str) -> None:
    def regenesis(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        resealed = seal({**record.hashed_fields(), field: "e" * 64})
        return resealed, record_message(resealed)

    path = tmp_path / "ledger.arrows"
    path.write_bytes(_altered(3, 0, regenesis))
    buf = path.read_bytes()
    assert Ledger(path)._verify_fast(buf, len(buf)) is None
    report = Ledger(path).verify()
    assert (report.ok, report.first_bad_seq) == (False, 0)


def test_a_version_1_ledger_is_decided_by_the_vectorised_pass(tmp_path: Path) -> None:
    schema, messages = _chain(4, version=1)
    path = tmp_path / "ledger.arrows"
    path.write_bytes(schema + b"".join(messages))
    buf = path.read_bytes()
    fast = Ledger(path)._verify_fast(buf, len(buf))
    assert fast is not None and fast[0] == 4


def test_a_version_1_ledger_is_read_with_its_own_schema() -> None:
    schema, messages = _chain(4, version=1)
    buf = schema + b"".join(messages)
    report, hashes, keys = verify.verify_slow(buf, len(buf))
    assert report == {"ok": True, "size": 4, "problems": [], "first_bad_seq": None, "torn_at": None}
    assert len(hashes) == 4 and keys.column("seq").to_pylist() == [0, 1, 2, 3] and keys.schema == KEYS


def test_a_foreign_arrow_schema_is_a_problem_of_seq_0() -> None:
    buf = pa.schema([("x", pa.int64())]).serialize().to_pybytes()
    report, _, _ = verify.verify_slow(buf, len(buf))
    assert report == {"ok": False, "size": 0, "problems": ["seq 0: the file's Arrow schema is not the ledger schema"],
                      "first_bad_seq": 0, "torn_at": None}


def test_verification_goes_on_after_a_message_that_does_not_decode() -> None:
    schema, messages = _chain(4)
    damaged = bytearray(messages[1])
    damaged[damaged.find(b"checks")] = 0xFF  # not UTF-8: the message still frames, and does not decode
    buf = schema + messages[0] + bytes(damaged) + messages[2] + messages[3]
    report, hashes, keys = verify.verify_slow(buf, len(buf))
    at = len(schema) + len(messages[0])  # where record 1's message starts
    # record 2 cannot chain to a record that was not read; records 2 and 3 are still checked and listed
    assert report["problems"] == [f"seq 1: the message at offset {at} does not decode as a ledger record",
                                  "seq 2: prev_hash does not chain to the previous record"]
    assert report["first_bad_seq"] == 1 and report["size"] == 4
    assert keys.column("seq").to_pylist() == [0, 2, 3] and len(hashes) == 3


def test_a_rechained_record_whose_run_id_column_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """Record 3's run_id column (not its hashed JSON) holds a byte that is not UTF-8, and the chain after it is
    recomputed: every hash and digest holds, yet the ledger is not one orch wrote. The vectorised pass reads the
    orphan keys as dictionary-encoded strings, which decodes them, and declines; the slow pass names the record."""

    def undecodable_run_id(record: LedgerRecord) -> tuple[LedgerRecord, bytes]:
        message = bytearray(record_message(record))
        at = message.find(b'\x01\x00\x00\x00r')  # the run_id column's one value, 'r', after its end offset (1)
        assert at > 0 and message.find(b'"run_id":"r"') > at
        message[at + 4] = 0xFF
        return record, bytes(message)

    buf = _altered(40, 3, undecodable_run_id)
    path = tmp_path / "ledger.arrows"
    path.write_bytes(buf)
    report = Ledger(path, fsync=False).verify()
    assert not report.ok and report.first_bad_seq == 3
    at = verify.scan_messages(buf, len(buf)).spans[3][0]
    assert report.problems[0] == f"seq 3: the message at offset {at} does not decode as a ledger record"


def test_a_record_the_schema_refuses_is_named_with_its_field_and_seq() -> None:
    schema, messages = _chain(3, gpus_at=1)
    buf = schema + b"".join(messages)
    report, _, _ = verify.verify_slow(buf, len(buf))
    assert report["problems"] == ["seq 1: schema: ('gpus',): Input should be greater than or equal to 0"]
    assert report["first_bad_seq"] == 1 and not report["ok"]


# -- the fast pass's work sharing: chunks from a pipe, this process and a forked child --

@contextmanager
def _only_children_exit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """The caller is never told to exit (an AssertionError there), and a child that comes back into the caller's code
    is ended with status 0 and fails the test: every child must leave through its own os._exit."""
    caller, real_exit = os.getpid(), os._exit
    came_back = mmap.mmap(-1, 1)  # shared with the children

    def exit_(code: int) -> None:
        if os.getpid() == caller:
            raise AssertionError(f"os._exit({code!r}) in the calling process")
        real_exit(code)

    monkeypatch.setattr(os, "_exit", exit_)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # the shared path runs on 2+ cores
    try:
        yield caller
    finally:
        if os.getpid() != caller:
            came_back[0] = 1
            real_exit(0)
    assert not came_back[0], "a forked child came back into the caller's code instead of leaving through os._exit"


def _wait_for(cond: object, limit_s: float = 5.0) -> None:
    deadline = time.monotonic() + limit_s
    while not cond() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.001)


COUNT = 40


def test_both_processes_take_chunks_and_each_chunk_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    here, child = mmap.mmap(-1, COUNT), mmap.mmap(-1, COUNT)  # shared: runs per chunk, by process
    with _only_children_exit(monkeypatch) as caller:
        def job(i: int) -> bool:
            ran = here if os.getpid() == caller else child
            ran[i] += 1
            return True

        def meanwhile() -> bool:  # this process reads the pipe only after it: wait until the child took a chunk
            _wait_for(lambda: any(child[:]))
            return True

        assert verify._shared_chunks(COUNT, job, meanwhile) is True
    runs = [here[i] + child[i] for i in range(COUNT)]
    assert runs == [1] * COUNT and sum(child[:]) >= 1


@pytest.mark.parametrize("failing", ["job", "raises", "meanwhile"])
def test_a_failing_chunk_or_meanwhile_fails_the_shared_pass(monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    def job(i: int) -> bool:
        if failing == "raises" and i == 30:
            raise ValueError("damaged offsets")
        return not (failing == "job" and i == 30)

    with _only_children_exit(monkeypatch):
        assert verify._shared_chunks(COUNT, job, lambda: failing != "meanwhile") is False


def test_a_bad_chunk_stops_both_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = mmap.mmap(-1, COUNT)
    with _only_children_exit(monkeypatch):
        def job(i: int) -> bool:
            ran[i] += 1
            return i != 0  # the child reads the pipe first (this process runs `meanwhile`): chunk 0 is its

        def meanwhile() -> bool:
            _wait_for(lambda: ran[0])
            return True

        assert verify._shared_chunks(COUNT, job, meanwhile) is False
    assert ran[:] == b"\x01" + bytes(COUNT - 1)  # chunk 0 failed in the child; no chunk ran after it


@pytest.mark.parametrize("chunk_0_good", [True, False])
def test_a_chunk_the_child_took_and_never_finished_is_done_here(monkeypatch: pytest.MonkeyPatch,
                                                                  chunk_0_good: bool) -> None:
    # the child reads the pipe first (this process runs `meanwhile`), takes chunk 0 and dies inside it, as if killed:
    # chunk 0 is still "not done" and no stop was raised, so this process must hash it itself after reaping the child
    # and decide by its result alone (chunks 1-39 are good)
    taken = mmap.mmap(-1, 1)
    with _only_children_exit(monkeypatch) as caller:
        def job(i: int) -> bool:
            if os.getpid() != caller:
                taken[0] = 1
                os._exit(0)
            return i != 0 or chunk_0_good

        def meanwhile() -> bool:
            _wait_for(lambda: taken[0], 60.0)  # a fork on a loaded 2-core host can take seconds
            return True

        assert verify._shared_chunks(COUNT, job, meanwhile) is chunk_0_good
    assert taken[0] == 1


def _fork(then: object) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            then()  # type: ignore[operator]
        finally:
            os._exit(3)
    return pid


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _end(pid: int) -> None:
    with suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_a_child_that_ends_by_itself_is_waited_for_and_reaped_at_once() -> None:
    r, w = os.pipe()
    pid = _fork(lambda: (time.sleep(0.2), os.write(w, b"done")))
    try:
        started = time.monotonic()
        verify._reap(pid, grace_s=30.0)
        took = time.monotonic() - started
        os.close(w)
        assert os.read(r, 4) == b"done"  # it was not killed before it finished
        assert _reaped(pid)
        assert 0.2 <= took < 0.9  # polled every 2 ms: back within moments of the child's end
    finally:
        os.close(r)
        _end(pid)


def test_a_stuck_child_is_killed_after_its_grace_and_reaped() -> None:
    pid = _fork(lambda: time.sleep(120))
    try:
        started = time.monotonic()
        verify._reap(pid, grace_s=0.3)
        took = time.monotonic() - started
        assert _reaped(pid)
        assert 0.3 <= took < 10.0
    finally:
        _end(pid)
