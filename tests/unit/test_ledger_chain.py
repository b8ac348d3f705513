"""The ledger's hash chain and durability, each rule on its own: a record re-sealed onto a wrong prev_hash is
refused by the fast and the slow verify, and every append is fsync'd (the directory too when the file is new)."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from ledger.cost.record import GENESIS, record_message, schema_message, seal
from ledger.cost.store import Ledger

BASE: dict[str, Any] = {"run_id": "r", "package": "checks", "kind": "checks", "arm": None, "gpus": 1,
                        "protocol_id": "b" * 64, "host": "a" * 64, "started": "2026-01-01T00:00:00Z"}


def _write_chain(path: Path, wrong_prev_at: int | None, n: int = 4) -> None:
    """n self-consistent records (each record_hash the SHA256 of its canonical JSON, each message digest right);
    record `wrong_prev_at` is sealed onto a prev_hash that is not its predecessor's record_hash."""
    data = schema_message()
    prev_hash, prev_message = GENESIS, hashlib.sha256(schema_message()).hexdigest()
    for seq in range(n):
        claimed = "e" * 64 if seq == wrong_prev_at else prev_hash
        status = "open" if seq % 2 == 0 else "ok"
        record = seal({**BASE, "status": status, "seq": seq, "prev_hash": claimed, "prev_message_sha256": prev_message})
        message = record_message(record)
        data += message
        prev_hash, prev_message = record.record_hash, hashlib.sha256(message).hexdigest()
    path.write_bytes(data)


def test_the_forged_chain_is_otherwise_valid(tmp_path: Path) -> None:
    path = tmp_path / "ledger.arrows"
    _write_chain(path, None)
    report = Ledger(path).verify()
    assert report.ok and report.size == 4, report.problems


@pytest.mark.parametrize("at", [1, 2, 3])
@pytest.mark.parametrize("path_taken", ["fast", "slow"])
def test_a_record_resealed_onto_a_wrong_prev_hash_fails_verify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int, path_taken: str
) -> None:
    path = tmp_path / "ledger.arrows"
    _write_chain(path, at)
    ledger = Ledger(path)
    buf = path.read_bytes()
    fast = ledger._verify_fast(buf, len(buf))
    assert fast is None  # the vectorised path must not accept it
    if path_taken == "slow":  # what verify falls back on whenever the fast path declines
        monkeypatch.setattr(Ledger, "_verify_fast", lambda self, buf, size: None)
    report = ledger.verify()
    assert not report.ok and report.first_bad_seq == at
    assert f"seq {at}: prev_hash does not chain to the previous record" in report.problems


def _count_fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[os.stat_result]:
    """Observe os.fsync (it still runs): the stat of every descriptor it is called on."""
    seen: list[os.stat_result] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.fstat(fd))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_every_append_is_fsynced_and_the_first_also_fsyncs_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows")
    ledger.host_hash()  # the salt file is created (and fsync'd) before any record
    seen = _count_fsyncs(monkeypatch)
    ledger.append(**{**BASE, "status": "open"})
    ino, dir_ino = ledger.path.stat().st_ino, ledger.path.parent.stat().st_ino
    assert [s.st_ino for s in seen].count(ino) == 1
    assert any(stat.S_ISDIR(s.st_mode) and s.st_ino == dir_ino for s in seen)  # the new file's directory entry
    for n in (2, 3):
        ledger.append(**{**BASE, "status": "open"})
        assert [s.st_ino for s in seen].count(ino) == n


def test_fsync_false_is_the_only_way_to_skip_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ledger = Ledger(tmp_path / "ledger" / "ledger.arrows", fsync=False)
    ledger.host_hash()
    seen = _count_fsyncs(monkeypatch)
    ledger.append(**{**BASE, "status": "open"})
    assert ledger.path.stat().st_ino not in [s.st_ino for s in seen]
