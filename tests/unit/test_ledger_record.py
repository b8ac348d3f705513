"""One ledger record (ledger.cost.record) on hand-made fields: times, notes, validation, the canonical JSON and its
hash, the two Arrow schemas and one record's Arrow message. Expected values are written out by hand.

Home paths are assembled at run time (string concatenation), so this file passes hygiene itself.
"""

from __future__ import annotations

import hashlib
import pwd
import time
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from pydantic import ValidationError

from ledger.cost import record as rec
from ledger.cost.record import (
    LedgerRecord,
    LedgerRecordV2,
    canonical_json,
    record_class,
    record_from_row,
    record_hash_of,
    record_message,
    schema_message,
    scrub_note,
    seal,
    utc_iso,
)

H = "a" * 64
V1_NAMES = ["seq", "run_id", "package", "kind", "arm", "status", "started", "ended", "wall_s", "gpus", "gpu_seconds",
            "lock_wait_s", "host", "protocol_id", "sources_root", "result_digest", "peak_allocated", "peak_reserved",
            "exit_code", "note", "prev_hash", "prev_message_sha256", "record_hash", "canonical"]


def minimal(**extra: Any) -> dict[str, Any]:
    return {"seq": 0, "run_id": "r1", "package": "checks", "kind": "checks", "status": "open", "host": H,
            "protocol_id": "p1", "prev_hash": "0" * 64, "prev_message_sha256": "b" * 64, **extra}


# --- times ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "always_us", "want"), [
    ("2026-01-02T03:04:05Z", False, "2026-01-02T03:04:05Z"),
    ("2026-01-02T03:04:05Z", True, "2026-01-02T03:04:05.000000Z"),
    ("2026-01-02T03:04:05+00:00", False, "2026-01-02T03:04:05Z"),
    ("2026-01-02T03:04:05.25Z", False, "2026-01-02T03:04:05.250000Z"),
    (datetime(2026, 1, 2, 3, 4, 5, 7, tzinfo=UTC), False, "2026-01-02T03:04:05.000007Z"),
    (datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(0))), True, "2026-01-02T03:04:05.000000Z"),
    (None, True, None),
])
def test_a_utc_time_is_iso_8601_with_z_and_microseconds_only_when_needed_or_asked(
    value: Any, always_us: bool, want: str | None
) -> None:
    assert utc_iso(value, always_us=always_us) == want


def test_utc_iso_keeps_seconds_by_default() -> None:
    assert utc_iso("2026-01-02T03:04:05Z") == "2026-01-02T03:04:05Z"


@pytest.mark.parametrize(("value", "message"), [
    ("yesterday", "not an ISO 8601 time: 'yesterday'"),
    (1767322800, "not a time: 1767322800"),
    ("2026-01-02T04:04:05+01:00", "time must be UTC (Z or +00:00): 2026-01-02T04:04:05+01:00"),
    # a 'Z' is the UTC suffix only: as a date-time separator (which fromisoformat alone would read) it is refused
    ("2026-01-02Z03:04:05Z", "not an ISO 8601 time: '2026-01-02Z03:04:05Z'"),
    (datetime(2026, 1, 2, 3, 4, 5), "time must be UTC (Z or +00:00): 2026-01-02T03:04:05"),
])
def test_a_time_that_is_not_a_utc_instant_is_refused_saying_why(value: Any, message: str) -> None:
    with pytest.raises(ValueError) as err:
        utc_iso(value)
    assert str(err.value) == message


def test_a_utc_time_is_written_in_utc_whatever_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        assert utc_iso(datetime(2026, 7, 2, 3, 4, 5, tzinfo=UTC)) == "2026-07-02T03:04:05Z"
        assert utc_iso("2026-01-02T03:04:05+00:00", always_us=True) == "2026-01-02T03:04:05.000000Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_only_an_upper_case_z_is_read_as_utc() -> None:
    with pytest.raises(ValueError, match="not an ISO 8601 time: '2026-01-02T03:04:05z'"):
        utc_iso("2026-01-02T03:04:05z")


def test_a_bad_time_string_keeps_its_cause() -> None:
    with pytest.raises(ValueError) as err:
        utc_iso("2026-13-01T00:00:00Z")
    assert isinstance(err.value.__cause__, ValueError)


def test_record_times_follow_the_record_version() -> None:
    one = seal(minimal(started="2026-01-02T03:04:05Z"), version=1)
    two = seal(minimal(started="2026-01-02T03:04:05Z"), version=2)
    assert one.started == "2026-01-02T03:04:05Z" and two.started == "2026-01-02T03:04:05.000000Z"
    assert seal(minimal(ended="2026-01-02T03:04:05+00:00"), version=1).ended == "2026-01-02T03:04:05Z"
    with pytest.raises(ValidationError, match="time must be UTC"):
        seal(minimal(ended="2026-01-02T04:04:05+01:00"))


# --- notes -----------------------------------------------------------------------------------------------------------

def test_a_note_becomes_one_line_without_control_characters() -> None:
    assert scrub_note("a\nb\tc\x7fd\x00e") == "a b c d e"


def test_a_note_loses_home_folders_but_keeps_the_rest_of_the_path() -> None:
    home, users, root = "/ho" + "me/", "/Us" + "ers/", "/ro" + "ot"
    assert scrub_note(f"read {home}alice/data/x.json") == "read ~/data/x.json"
    assert scrub_note(f"see {users}bob/proj ok") == "see ~/proj ok"
    assert scrub_note(f"cache {root}/.cache/hub") == "cache ~/hub"
    assert scrub_note(f"cd {root}") == "cd ~"
    assert scrub_note("/tmp/x and /homework/y") == "/tmp/x and /homework/y"


def test_a_note_loses_this_hosts_name_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rec.socket, "gethostname", lambda: "gpu-box.lab")
    assert scrub_note("ran on GPU-BOX.LAB and gpu-boxXlab") == "ran on <host> and gpu-boxXlab"
    monkeypatch.setattr(rec.socket, "gethostname", lambda: "abc")
    assert scrub_note("abc at ABC") == "<host> at <host>"
    monkeypatch.setattr(rec.socket, "gethostname", lambda: "ab")  # shorter than 3: ordinary letters, kept
    assert scrub_note("ab cab") == "ab cab"


def test_a_note_is_cut_to_200_characters_with_an_ellipsis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rec.socket, "gethostname", lambda: "zz")
    assert scrub_note("x" * 200) == "x" * 200
    cut = scrub_note("x" * 201)
    assert cut == "x" * 199 + "…" and len(cut) == 200


def test_a_record_refuses_a_note_longer_than_200_or_with_a_control_character() -> None:
    assert seal(minimal(note="n" * 200)).note == "n" * 200
    for bad in ("n" * 201, "two\nlines", "tab\there"):
        with pytest.raises(ValidationError, match="note must be one line of at most 200 characters"):
            seal(minimal(note=bad))
    assert seal(minimal(note=None)).note is None


# --- fields ----------------------------------------------------------------------------------------------------------

def test_durations_must_be_finite_and_are_floats() -> None:
    r = seal(minimal(wall_s=3, gpu_seconds=24, lock_wait_s=0))
    assert (r.wall_s, r.gpu_seconds, r.lock_wait_s) == (3.0, 24.0, 0.0)
    assert all(type(v) is float for v in (r.wall_s, r.gpu_seconds, r.lock_wait_s))
    assert '"wall_s":3.0' in canonical_json(r.hashed_fields())
    for name in ("wall_s", "gpu_seconds", "lock_wait_s"):
        with pytest.raises(ValidationError, match="must be finite"):
            seal(minimal(**{name: float("inf")}))
    assert seal(minimal()).wall_s is None


def test_canonical_json_sorts_keys_keeps_utf8_and_refuses_nan() -> None:
    assert canonical_json({"b": 1, "a": "é", "c": [1.5, None]}) == '{"a":"é","b":1,"c":[1.5,null]}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_the_record_hash_is_the_sha256_of_the_canonical_json_without_it() -> None:
    assert record_hash_of({"b": 1, "a": "é"}) == hashlib.sha256('{"a":"é","b":1}'.encode()).hexdigest()
    r = seal(minimal(), version=1)
    text = ('{"arm":null,"ended":null,"exit_code":null,"gpu_seconds":null,"gpus":0,"host":"' + H + '",'
            '"kind":"checks","lock_wait_s":null,"note":null,"package":"checks","peak_allocated":null,'
            '"peak_reserved":null,"prev_hash":"' + "0" * 64 + '","prev_message_sha256":"' + "b" * 64 + '",'
            '"protocol_id":"p1","result_digest":null,"run_id":"r1","seq":0,"sources_root":null,"started":null,'
            '"status":"open","wall_s":null}')
    assert canonical_json(r.hashed_fields()) == text
    assert r.record_hash == hashlib.sha256(text.encode()).hexdigest()
    two = seal(minimal(user="alice"), version=2)
    assert type(two) is LedgerRecordV2 and two.user == "alice"
    text2 = text.replace('"status":"open","wall_s":null}', '"status":"open","user":"alice","wall_s":null}')
    assert two.record_hash == hashlib.sha256(text2.encode()).hexdigest()


def test_seal_writes_the_latest_version_unless_told() -> None:
    assert type(seal(minimal())) is LedgerRecordV2
    assert type(seal(minimal(), version=1)) is LedgerRecord
    with pytest.raises(ValidationError):
        seal(minimal(user="alice"), version=1)  # version 1 has no user field
    assert seal(minimal(record_hash=H)).record_hash == seal(minimal()).record_hash  # seal computes it


def test_record_class_and_the_schemas_by_version() -> None:
    assert record_class(1) is LedgerRecord and record_class(2) is LedgerRecordV2
    assert [n for n, _ in rec.fields_of(1)] == V1_NAMES
    v2 = [*V1_NAMES[:13], "user", *V1_NAMES[13:]]
    assert [n for n, _ in rec.fields_of(2)] == v2 == [n for n, _ in rec._v2_fields()]
    assert rec.schema_of(1).names == V1_NAMES and rec.schema_of(2).names == v2
    one, two = rec.schema_of(1), rec.schema_of(2)
    assert one.field("started").type == pa.string() and one.field("ended").type == pa.string()
    assert two.field("started").type == pa.timestamp("us", tz="UTC") == two.field("ended").type
    assert two.field("user").type == pa.string() and two.field("user").nullable
    built = dict(rec._v2_fields())  # what SCHEMA_V2 is made of (at import)
    assert built["started"] == built["ended"] == pa.timestamp("us", tz="UTC")
    assert built["seq"] == pa.int64() and built["wall_s"] == pa.float64() and built["user"] == pa.string()
    assert one.metadata[b"format"] == b"orch.ledger/1" and two.metadata[b"format"] == b"orch.ledger/2"
    assert not two.field("seq").nullable and two.field("note").nullable


def test_the_schema_message_is_the_serialized_schema_of_that_version() -> None:
    for version in (1, 2):
        assert pa.ipc.read_schema(pa.py_buffer(schema_message(version))).names == rec.schema_of(version).names
    assert schema_message() == schema_message(2)


def _decode(message: bytes, version: int) -> dict[str, Any]:
    batch = pa.ipc.read_record_batch(pa.py_buffer(message), rec.schema_of(version))
    assert batch.num_rows == 1
    return {name: batch.column(name)[0].as_py() for name in batch.schema.names}


def test_a_records_message_is_one_arrow_row_with_its_canonical_json() -> None:
    r1 = seal(minimal(started="2026-01-02T03:04:05Z", wall_s=1.5), version=1)
    row = _decode(record_message(r1), 1)
    assert row["started"] == "2026-01-02T03:04:05Z" and row["wall_s"] == 1.5 and row["record_hash"] == r1.record_hash
    assert row["canonical"] == canonical_json(r1.hashed_fields())
    r2 = seal(minimal(started="2026-01-02T03:04:05Z", user="alice"), version=2)
    row2 = _decode(record_message(r2), 2)
    assert row2["started"] == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) and row2["ended"] is None
    assert row2["user"] == "alice" and '"started":"2026-01-02T03:04:05.000000Z"' in row2["canonical"]


def test_a_decoded_row_with_a_user_column_is_a_version_2_record() -> None:
    r2 = seal(minimal(user="alice"), version=2)
    back = record_from_row({**r2.model_dump(), "canonical": "dropped"})
    assert type(back) is LedgerRecordV2 and back == r2
    r1 = seal(minimal(), version=1)
    back1 = record_from_row({**r1.model_dump(), "canonical": "dropped"})
    assert type(back1) is LedgerRecord and back1 == r1


def test_the_login_name_comes_from_the_user_database_not_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    monkeypatch.setattr(rec.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(rec.pwd, "getpwuid", lambda uid: SimpleNamespace(pw_name=f"user-of-{uid}"))
    assert rec.login_name() == "user-of-4242"

    def missing(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(rec.pwd, "getpwuid", missing)
    assert rec.login_name() == "uid4242"
