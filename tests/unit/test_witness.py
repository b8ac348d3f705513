"""Witnessed heads: a run forged and re-appended with orch's own code is refused by `orch audit` when any head
witnessed before the forgery (orch's own witness file, a file named by $ORCH_WITNESS, published evidence) is
not a prefix of the ledger."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from cliutil import orch
from test_audit import RunSpec, make_run

from ledger.cost.store import Ledger
from ledger.cost.witness import ENV_WITNESS, WITNESS_FILE, check_witnessed, ledger_id, witnessed_heads
from ledger.files.publish import publish_run
from ledger.verdict.documents.audit import audit_run
from protocol.errors import FailedError
from protocol.home import resolve_home

REPO = Path(__file__).resolve().parents[2]
SLOW_C = RunSpec(durations={"A": [0.2] * 16, "C": [0.3] * 16, "B": [0.2] * 16})  # the honest run: a slowdown


def _record_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    reader = pa.BufferReader(pa.py_buffer(data))
    pa.ipc.read_message(reader)
    starts = []
    while reader.tell() < len(data):
        starts.append(reader.tell())
        pa.ipc.read_message(reader)
    return starts


def _forge(home: Path, run_id: str = "run1") -> None:
    """What the reviewer did: cut the ledger back to where the run began, drop its caches and the audit, and
    fabricate the run again (a 2x faster candidate) through orch's own ledger code."""
    h = resolve_home(home)
    first = min(r.seq for r in Ledger(h.ledger_path).records(run_id))
    cut = _record_offsets(h.ledger_path)[first]
    h.ledger_path.write_bytes(h.ledger_path.read_bytes()[:cut])
    for cache in (".tail", ".idx"):
        h.ledger_path.with_name(h.ledger_path.name + cache).unlink(missing_ok=True)
    shutil.rmtree(h.run_dir(run_id))
    make_run(home, run_id)
    assert Ledger(h.ledger_path).verify().ok  # the forgery verifies on its own


def _honest_history(home: Path) -> None:
    make_run(home, "run0")
    audit_run(home, "run0")
    make_run(home, "run1", spec=SLOW_C)
    assert audit_run(home, "run1").document["speedup"]["headline"] < 1


def test_forged_run_is_refused_against_orchs_own_witness(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _honest_history(home)
    own = home / "witness" / WITNESS_FILE
    lines = [json.loads(line) for line in own.read_text().splitlines()]
    assert [w["by"] for w in lines] == ["audit run0", "audit run1"]
    _forge(home)
    with pytest.raises(FailedError, match=r"not an extension of head \d+:.* witnessed in .*heads.jsonl:2 "
                                          r"\(audit run1\): records were removed or rewritten"):
        audit_run(home, "run1")
    assert not (home / "runs" / "run1" / "audit.json").exists()


def test_forged_run_is_refused_by_the_cli_in_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _honest_history(home)
    _forge(home)
    proc = orch("audit", "run1", "--home", str(home), cwd=tmp_path)  # in this process (tests/cliutil.py)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1
    assert "not an extension of head" in proc.stderr


def test_a_witness_file_named_by_the_user_still_refuses_when_orchs_own_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = tmp_path / "offsite" / "heads.jsonl"
    monkeypatch.setenv(ENV_WITNESS, str(elsewhere))
    home = tmp_path / "home"
    _honest_history(home)
    assert len(elsewhere.read_text().splitlines()) == 2  # orch writes its witness there too
    _forge(home)
    shutil.rmtree(home / "witness")  # the forger has the home; not the named file
    with pytest.raises(FailedError, match=f"witnessed in {elsewhere}:2"):
        audit_run(home, "run1")


def test_published_evidence_is_a_witness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    home = tmp_path / "home"
    monkeypatch.chdir(repo)
    make_run(home, "run0")
    audit_run(home, "run0")
    make_run(home, "run1", spec=SLOW_C)
    audit_run(home, "run1")
    publish_run(home, "run1", Path("docs/validation/run1.json"))
    evidence = json.loads((repo / "docs" / "validation" / "run1.json").read_text())
    assert evidence["ledger_id"] == ledger_id(Ledger(resolve_home(home).ledger_path))
    _forge(home)
    shutil.rmtree(home / "witness")
    with pytest.raises(FailedError, match=r"witnessed in docs/validation/run1.json \(publish run1\)"):
        audit_run(home, "run1")


def test_honest_growth_passes_and_every_head_is_checked(tmp_path: Path) -> None:
    home = tmp_path / "home"
    _honest_history(home)
    make_run(home, "run2", RunSpec(calibrated=True))  # one triplet, bounded by the host's A/A calibration
    h = resolve_home(home)
    ledger = Ledger(h.ledger_path)
    assert check_witnessed(h, ledger, None) == 2
    assert audit_run(home, "run2").verdict == "accepted"
    assert len(witnessed_heads(h, ledger, None)) == 3


def test_replaced_ledger_and_damaged_witness_lines_are_refused(tmp_path: Path) -> None:
    home = tmp_path / "home"
    make_run(home, "run0")
    audit_run(home, "run0")
    h = resolve_home(home)
    own = h.witness_dir / WITNESS_FILE
    good = own.read_text()
    own.write_text(good + '{"schema": "orch.witness/1", "size": 3')  # torn last line (a crash): ignored
    assert check_witnessed(h, Ledger(h.ledger_path), None) == 1
    own.write_text("garbage\n" + good)
    with pytest.raises(FailedError, match=r"heads.jsonl:1 is not a witnessed head"):
        check_witnessed(h, Ledger(h.ledger_path), None)
    own.write_text(good)
    shutil.rmtree(h.ledger_dir)  # a new ledger (a new salt) under the same home
    make_run(home, "run9")
    with pytest.raises(FailedError, match="holds a head of another ledger"):
        audit_run(home, "run9")


def test_a_run_witnessed_in_a_replaced_ledger_is_refused_through_a_named_witness_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # found by the attack battery: ledger, salt and the home's witness replaced by a re-appended copy audited as
    # before, because heads of another ledger id in a $ORCH_WITNESS file were skipped
    elsewhere = tmp_path / "offsite" / "heads.jsonl"
    monkeypatch.setenv(ENV_WITNESS, str(elsewhere))
    home = tmp_path / "home"
    make_run(home, "run0")
    audit_run(home, "run0")
    h = resolve_home(home)
    records = [r.model_dump() for r in Ledger(h.ledger_path).records()]
    shutil.rmtree(h.ledger_dir)
    shutil.rmtree(h.witness_dir)
    forged = Ledger(h.ledger_path)  # a new salt: another ledger id
    for r in records:
        forged.append(**{k: v for k, v in r.items() if k not in ("seq", "prev_hash", "prev_message_sha256",
                                                                  "record_hash", "canonical")})
    with pytest.raises(FailedError, match=rf"{elsewhere}:1 saw run run0 in another ledger"):
        audit_run(home, "run0")
    monkeypatch.delenv(ENV_WITNESS)
    assert audit_run(home, "run0").verdict  # nothing else knew this home's ledger: the limit the README states
