"""ledger/verdict/decide/integrity.py: what run.json records (through its model) is checked against the sealed copies,
the protocol copy, the results and the ledger, one line per problem."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from test_audit import make_run

from ledger.cost.store import Ledger
from ledger.verdict.decide.evidence import collect_evidence
from ledger.verdict.decide.integrity import verify_integrity
from protocol.home import resolve_home
from protocol.run_record import RunRecord


def _problems(home: Path, edit: Callable[[RunRecord], RunRecord] | None = None) -> list[str]:
    run_json = home / "runs" / "run1" / "run.json"
    if edit is not None:
        run_json.write_bytes(edit(RunRecord.model_validate_json(run_json.read_bytes())).to_bytes())
    h = resolve_home(home)
    return verify_integrity(collect_evidence(h, "run1"), Ledger(h.ledger_path))


def test_a_run_as_recorded_verifies(tmp_path: Path) -> None:
    make_run(tmp_path)
    assert _problems(tmp_path) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda r: r.with_arm("candidate", sealed_root="0" * 64),
         ["seal of candidate: sealed/candidate.manifest.json is not the seal recorded in run.json"]),
        (lambda r: r.with_arm("candidate", sources_root="0" * 64),
         ["seal of candidate: the sealed sources do not hash to run.json's sources_root"]),
        (lambda r: r.updated(arms={"baseline": r.arms["baseline"]}), ["run.json: no arms.candidate"]),
        (lambda r: r.with_package(r.packages[1].finish(result_sha256="0" * 64)),
         ["run.json: result_sha256 of train-A is not the digest of its result"]),
    ],
)  # fmt: skip
def test_what_run_json_records_must_match_the_evidence(
    tmp_path: Path, edit: Callable[[RunRecord], RunRecord], expected: list[str]
) -> None:
    make_run(tmp_path)
    assert _problems(tmp_path, edit) == expected


def test_sealed_sources_that_are_not_the_commitment_need_an_arm_under_evaluation(tmp_path: Path) -> None:
    make_run(tmp_path)
    run = RunRecord.model_validate_json((tmp_path / "runs" / "run1" / "run.json").read_bytes())
    sources = run.arms["baseline"].sources_root
    problems = _problems(tmp_path, lambda r: r.with_arm("baseline", commitment_root="ab" * 32))
    assert problems == [f"seal of baseline: sealed sources {sources[:16]} are not the commitment {'ab' * 8} and the "
                        "arm is not declared under evaluation"]


def test_an_altered_protocol_copy_or_a_missing_sealed_score_is_named(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    proto = run_dir / "protocol.json"
    proto.write_text(json.dumps(json.loads(proto.read_text()), indent=2))  # the same protocol, other bytes
    (run_dir / "score.sealed.json").chmod(0o600)
    (run_dir / "score.sealed.json").unlink()
    assert _problems(tmp_path) == [
        "protocol.json: its sha256 is not run.json's protocol_id (the protocol copy was altered)",
        "score.sealed.json: missing",
    ]
