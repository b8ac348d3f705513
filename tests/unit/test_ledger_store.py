"""The ledger store on real files: hash chain, Arrow readability, tamper detection, torn tails, write errors, locks."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledgerutil import offsets

from ledger.cost.layout import layout
from ledger.cost.merkle import TreeHead, parse_head
from ledger.cost.record import GENESIS, schema_message
from ledger.cost.salt import host_hash
from ledger.cost.store import Ledger
from protocol.errors import FailedError, UsageError

REPO = Path(__file__).resolve().parents[2]
KINDS = [("checks", "checks", None), ("train-A", "train", "baseline"), ("reload-C", "reload", "candidate"),
         ("score", "score", None)]


def fields(i: int, **extra: Any) -> dict[str, Any]:
    name, kind, arm = KINDS[(i // 2) % len(KINDS)]
    base: dict[str, Any] = {"run_id": f"run-{i // 8}", "package": name, "kind": kind, "arm": arm,
                            "started": "2025-03-01T10:00:00Z", "gpus": 8, "protocol_id": "p" * 64}
    if i % 2 == 0:
        return {**base, "status": "open", **extra}
    return {**base, "status": "ok", "ended": "2025-03-01T10:01:00.250000Z", "wall_s": 60.25, "gpu_seconds": 482.0,
            "lock_wait_s": 0.5, "exit_code": 0, "result_digest": "d" * 64, "peak_allocated": 10**11, **extra}


def fill(ledger: Ledger, n: int) -> None:
    for i in range(n):
        ledger.append(**fields(i))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "ledger" / "ledger.arrows")


def test_fast_reader_is_active() -> None:
    assert layout() is not None  # otherwise every read below would take the slow path only


def test_append_chain_and_plain_arrow_reader(ledger: Ledger, tmp_path: Path) -> None:
    fill(ledger, 5)
    code = f"import pyarrow.ipc as i; print(i.open_stream({str(ledger.path)!r}).read_all().num_rows)"
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "5"
    table = pa.ipc.open_stream(str(ledger.path)).read_all()
    prev = GENESIS
    prev_msg = hashlib.sha256(schema_message()).hexdigest()
    data = ledger.path.read_bytes()
    starts = [*offsets(ledger.path), len(data)]
    assert table.schema.field("started").type == pa.timestamp("us", tz="UTC")
    for i, row in enumerate(table.to_pylist()):
        hashed = {k: v for k, v in row.items() if k not in ("record_hash", "canonical")}
        # in the canonical JSON (version 2) times are ISO 8601 with microseconds and Z, the columns real timestamps
        hashed.update({k: v.strftime("%Y-%m-%dT%H:%M:%S.%fZ") for k, v in hashed.items() if hasattr(v, "strftime")})
        assert hashed["user"] and hashed["user"] != socket.gethostname()
        canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert row["canonical"] == canonical
        assert row["record_hash"] == hashlib.sha256(canonical.encode()).hexdigest()
        assert row["seq"] == i and row["prev_hash"] == prev and row["prev_message_sha256"] == prev_msg
        prev = row["record_hash"]
        prev_msg = hashlib.sha256(data[starts[i] : starts[i + 1]]).hexdigest()
    records = ledger.records()
    assert [r.seq for r in records] == list(range(5))
    assert records[1].ended == "2025-03-01T10:01:00.250000Z" and records[1].gpu_seconds == 482.0
    assert records[0].started == "2025-03-01T10:00:00.000000Z"  # one format: microseconds always
    assert [r.seq for r in ledger.records(run_id="run-0")] == list(range(5))
    assert ledger.table().equals(table.combine_chunks())  # the vectorised decoder equals pyarrow's reader
    assert ledger.verify().ok


def test_host_is_a_salted_hash(ledger: Ledger) -> None:
    fill(ledger, 2)
    salt_file = ledger.path.parent / "host.salt"
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    rec = ledger.records()[0]
    assert rec.host == host_hash(ledger.path.parent) == host_hash(salt_file.read_text().strip())
    assert rec.host != host_hash("another salt")
    assert socket.gethostname().encode() not in ledger.path.read_bytes()


def test_refuses_bad_records(ledger: Ledger) -> None:
    with pytest.raises(UsageError, match="assigned"):
        ledger.append(**fields(0), seq=3)
    with pytest.raises(UsageError, match="status"):
        ledger.append(**fields(0) | {"status": "running"})
    with pytest.raises(UsageError, match="started"):
        ledger.append(**fields(0) | {"started": "2025-03-01T10:00:00+02:00"})
    assert not ledger.path.exists() or ledger.records() == []
    home_path = "/" + "home/alice/x.py"  # built at run time: the repository itself must pass `orch hygiene`
    rec = ledger.append(**fields(1) | {"note": f"exit 1: {home_path} failed\nTraceback"})
    assert rec.note == "exit 1: ~/x.py failed Traceback"


def test_orphaned_open_records(ledger: Ledger) -> None:
    ledger.append(**fields(0))
    ledger.append(**fields(2))
    ledger.append(**fields(1))  # closes train? no: fields(1) is checks' close
    report = ledger.verify()
    assert report.ok and report.orphaned == [("run-0", "train-A")]
    ledger.append(**fields(3))
    assert ledger.verify().orphaned == []


def expected_bad_seq(path_starts: list[int], pos: int) -> int:
    """The seq of the record whose message holds byte `pos` (the schema counts as record 0)."""
    return max(0, sum(1 for s in path_starts if s <= pos) - 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 7), data=st.data())
def test_any_flip_truncation_or_reorder_names_the_first_bad_seq(tmp_path: Path, n: int, data: st.DataObject) -> None:
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "ledger.arrows"  # a fresh ledger for every example
    ledger = Ledger(path)
    fill(ledger, n)
    assert ledger.verify().ok  # a valid ledger always verifies
    original = path.read_bytes()
    starts = offsets(path)
    action = data.draw(st.sampled_from(["flip", "truncate", "reorder"] if n > 1 else ["flip", "truncate"]))
    if action == "flip":
        pos = data.draw(st.integers(0, len(original) - 1))
        bit = data.draw(st.integers(0, 7))
        damaged = bytearray(original)
        damaged[pos] ^= 1 << bit
        want = expected_bad_seq(starts, pos)
    elif action == "truncate":
        cut = data.draw(st.integers(0, len(original) - 1))
        damaged = bytearray(original[:cut])
        bounds = [*starts, len(original)]
        want = sum(1 for i in range(len(starts)) if bounds[i + 1] <= cut)  # records wholly before the cut
    else:
        i = data.draw(st.integers(0, n - 2))
        ends = [*starts[1:], len(original)]
        a, b = original[starts[i] : ends[i]], original[starts[i + 1] : ends[i + 1]]
        damaged = bytearray(original[: starts[i]] + b + a + original[ends[i + 1] :])
        want = i
    path.write_bytes(bytes(damaged))
    report = ledger.verify()
    assert not report.ok
    assert report.first_bad_seq == want, (action, report.problems)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(4, 12), data=st.data())
def test_two_process_verify_names_the_first_bad_seq(tmp_path: Path, n: int, data: st.DataObject) -> None:
    path = Path(tempfile.mkdtemp(dir=tmp_path)) / "ledger.arrows"
    fill(Ledger(path, fsync=False), n)
    ledger = Ledger(path, verify_chunk=1)  # one record per hashing task: the forked child takes some of them
    report = ledger.verify()
    assert report.ok and report.size == n and report.orphaned == Ledger(path).verify().orphaned
    original, starts = path.read_bytes(), offsets(path)
    pos = data.draw(st.integers(0, len(original) - 1))
    damaged = bytearray(original)
    damaged[pos] ^= 1 << data.draw(st.integers(0, 7))
    path.write_bytes(bytes(damaged))
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == expected_bad_seq(starts, pos), report.problems


def test_dictionary_table_has_the_same_values(ledger: Ledger) -> None:
    fill(ledger, 9)
    plain = ledger.table()
    encoded = ledger.table(dictionary=True)
    assert pa.types.is_dictionary(encoded["arm"].type) and encoded["arm"].null_count == plain["arm"].null_count
    for name in plain.column_names:
        assert encoded[name].cast(plain[name].type).equals(plain[name]), name
    empty = Ledger(ledger.path.with_name("empty.arrows"))
    empty.path.write_bytes(schema_message())  # a ledger whose records were never written
    assert empty.table(["run_id", "arm"], dictionary=True).num_rows == 0


def test_torn_tail_is_reported_refused_and_repaired(ledger: Ledger) -> None:
    fill(ledger, 3)
    good = ledger.path.read_bytes()
    other = Ledger(ledger.path.with_name("other.arrows"))
    fill(other, 4)
    last = other.path.read_bytes()[offsets(other.path)[-1] :]
    torn = last[: len(last) // 2]  # a crash halfway through writing a record
    ledger.path.write_bytes(good + torn)
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 3 and report.torn_at == len(good) and report.size == 3
    with pytest.raises(FailedError, match="torn tail"):
        ledger.append(**fields(3))
    aside = ledger.repair()
    assert aside is not None and aside.read_bytes() == torn and aside.parent == ledger.path.parent
    assert ledger.path.read_bytes() == good and ledger.verify().ok
    assert ledger.repair() is None
    assert ledger.append(**fields(3)).seq == 3 and ledger.verify().ok


def test_repair_refuses_damage_inside(ledger: Ledger) -> None:
    fill(ledger, 3)
    data = bytearray(ledger.path.read_bytes())
    data[offsets(ledger.path)[1]] ^= 0xFF  # record 1's continuation marker: records 1 and 2 no longer parse
    ledger.path.write_bytes(bytes(data))
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 1
    with pytest.raises(FailedError, match="not a torn"):
        ledger.repair()
    assert ledger.path.read_bytes() == bytes(data)


def test_head_and_consistency(ledger: Ledger) -> None:
    fill(ledger, 5)
    old = ledger.head()
    assert old.size == 5 and len(old.root) == 64
    fill(ledger, 4)  # same fields again: seq and chain make them new records
    new = ledger.head()
    assert new.size == 9 and new.root != old.root
    assert ledger.consistency(old.size, old.root)
    assert ledger.verify(against=old).ok
    wrong = TreeHead(size=5, root=hashlib.sha256(b"x").hexdigest())
    assert not ledger.consistency(wrong.size, wrong.root)
    assert not ledger.verify(against=wrong).ok
    assert not ledger.verify(against=TreeHead(size=10, root=new.root)).ok
    assert parse_head(str(new)) == new
    with pytest.raises(UsageError):
        parse_head("5:xyz")


def test_truncation_at_a_record_boundary_is_detected(ledger: Ledger) -> None:
    fill(ledger, 4)
    head = ledger.head()
    ledger.path.write_bytes(ledger.path.read_bytes()[: offsets(ledger.path)[3]])
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == 3 and "truncated" in report.problems[0]
    assert not ledger.verify(against=head).ok


def test_append_after_a_truncation_at_a_record_boundary_is_refused_and_never_hides_it(ledger: Ledger) -> None:
    fill(ledger, 6)
    cut = ledger.path.read_bytes()[: offsets(ledger.path)[4]]
    ledger.path.write_bytes(cut)  # two whole records gone: every remaining byte still chains
    with pytest.raises(FailedError, match="holds 4 records but 6 were appended"):
        ledger.append(**fields(4))
    assert ledger.path.read_bytes() == cut  # nothing appended, and the hint still counts 6
    report = ledger.verify()
    assert not report.ok and "truncated: 6 records were appended but 4" in report.problems[0]
    ledger.path.unlink()  # a deleted ledger is a truncation to nothing
    with pytest.raises(FailedError, match="holds 0 records but 6"):
        ledger.append(**fields(0))


def test_failed_write_leaves_the_ledger_unchanged(ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(ledger, 3)
    before = ledger.path.read_bytes()
    real = os.pwrite

    def half_then_full(fd: int, data: Any, offset: int) -> int:
        real(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(28, "No space left on device")

    import ledger.cost.store as store

    monkeypatch.setattr(store.os, "pwrite", half_then_full)
    with pytest.raises(FailedError, match="No space left"):
        ledger.append(**fields(3))
    monkeypatch.undo()
    assert ledger.path.read_bytes() == before and ledger.verify().ok
    assert ledger.append(**fields(3)).seq == 3


def test_file_size_limit_fails_cleanly_in_a_real_process(ledger: Ledger) -> None:
    fill(ledger, 2)
    before = ledger.path.read_bytes()
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from ledger.cost.store import Ledger
        from protocol.errors import FailedError
        resource.setrlimit(resource.RLIMIT_FSIZE, ({len(before) + 100}, resource.RLIM_INFINITY))
        try:
            Ledger(Path({str(ledger.path)!r})).append(run_id="r", package="checks", kind="checks", status="open",
                                                      protocol_id="p")
        except FailedError as err:
            print("FAILED", err.exit_code, err.message)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("FAILED 1 ledger write failed"), out.stdout + out.stderr
    assert ledger.path.read_bytes() == before and ledger.verify().ok


def test_two_processes_append_concurrently(ledger: Ledger, tmp_path: Path) -> None:
    """Two writer processes that start appending at the same moment (each waits for a go file after saying it is
    ready): every record lands once, the chain verifies, and the two writers' records interleave in the file."""
    fill(ledger, 1)
    n = 500
    # fsync is skipped in this test only (fsync=False): thousands of fsyncs would dominate the suite's time budget
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from ledger.cost.store import Ledger
        led = Ledger(Path({str(ledger.path)!r}), fsync=False)
        Path({str(tmp_path)!r}, "ready" + sys.argv[1]).touch()
        deadline = time.monotonic() + 120  # a writer left waiting by a failed test ends on its own
        while not Path({str(tmp_path)!r}, "go").exists():
            if time.monotonic() > deadline:
                sys.exit("no go file")
            time.sleep(0.001)
        for i in range({n}):
            led.append(run_id="w" + sys.argv[1], package="train-A", kind="train", status="ok", protocol_id="p",
                       gpu_seconds=float(i))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(k)]) for k in (1, 2)]
    while not all((tmp_path / f"ready{k}").exists() for k in (1, 2)):
        assert all(p.poll() is None for p in procs), "a writer ended before it was ready"
        time.sleep(0.005)  # not a busy loop: the writers' interpreters need the cores
    (tmp_path / "go").touch()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    report = ledger.verify()
    assert report.ok and report.size == 2 * n + 1
    ids = ledger.table(["run_id"])["run_id"].to_pylist()
    assert ids.count("w1") == ids.count("w2") == n
    switches = sum(a != b for a, b in itertools.pairwise(ids[1:]))  # after the one record of fill()
    assert switches >= 2, "the two writers never interleaved: the test did not exercise concurrent appends"


def test_a_record_whose_time_a_flip_put_out_of_range_is_unparseable_not_a_crash(tmp_path: Path) -> None:
    """A flipped byte in a timestamp's high bits gives a value Python's datetime cannot hold: the record does not
    decode (UNPARSEABLE, so verify names it), it never raises OverflowError out of the scan."""
    from ledger.cost.record import INSTANT, schema_of
    from ledger.cost.scan import UNPARSEABLE, decode_message

    schema = schema_of(2)
    times = [i for i, f in enumerate(schema) if f.type == INSTANT]
    assert times, "the version 2 schema stores times as timestamps"
    columns = [pa.array([2**62 if i == times[0] else None], type=f.type) if i == times[0] or f.nullable
               else pa.array([pa.scalar(0, type=f.type) if pa.types.is_integer(f.type) else None], type=f.type)
               for i, f in enumerate(schema)]
    batch = pa.RecordBatch.from_arrays(columns, schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch)
    raw = sink.getvalue().to_pybytes()[len(schema_message(2)):-8]  # the record batch message alone
    with pytest.raises(UNPARSEABLE):
        decode_message(raw, 2)
