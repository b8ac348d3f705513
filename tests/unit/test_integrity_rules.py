"""ledger/verdict/decide/integrity.py rule by rule: the ledger's own verify, each arm's seal and commitment, each
package's result digest against the ledger and run.json, the score's sealed file, the step files; one line per problem,
in that order. The evidence is a fabricated complete run (test_audit.make_run), altered on disk or in the loaded
RunEvidence; each expected line is written out by hand.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from test_audit import make_run

from ledger.cost.store import Ledger
from ledger.verdict.decide.evidence import RunEvidence, collect_evidence
from ledger.verdict.decide.integrity import verify_integrity
from protocol.home import resolve_home
from protocol.schema import Protocol


def _evidence(home: Path) -> RunEvidence:
    return collect_evidence(resolve_home(home), "run1")


def _ledger(home: Path) -> Ledger:
    return Ledger(resolve_home(home).ledger_path)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class _Report:
    ok: bool
    message: str


class _Verified:
    """A ledger whose verify() says `report`: verify_integrity asks the ledger nothing else."""

    def __init__(self, report: _Report) -> None:
        self.report = report

    def verify(self) -> _Report:
        return self.report


def test_a_ledger_that_does_not_verify_is_named_with_its_words_and_the_command_to_run(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    bad = _Verified(_Report(False, "ledger record 7: record_hash does not match its fields"))
    assert verify_integrity(ev, bad) == [  # type: ignore[arg-type]
        "ledger record 7: record_hash does not match its fields; run `orch ledger verify` for details"]
    assert verify_integrity(ev, _Verified(_Report(True, "ignored when ok"))) == []  # type: ignore[arg-type]


def test_a_ledger_altered_on_disk_fails_its_verify(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    path = resolve_home(tmp_path).ledger_path
    data = path.read_bytes()
    at = data.index(b'"ok"')
    path.write_bytes(data[:at] + b'"no"' + data[at + 4:])  # one record's status changed, its hash kept
    problems = verify_integrity(ev, _ledger(tmp_path))
    assert len(problems) == 1 and problems[0].endswith("; run `orch ledger verify` for details")


def _without_arm(ev: RunEvidence, arm: str) -> None:
    ev.run = ev.run.updated(arms={k: v for k, v in ev.run.arms.items() if k != arm})


def test_a_missing_arm_skips_only_that_arms_checks(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "sealed" / "candidate" / "README.md").write_text("# edited\n")
    ev = _evidence(tmp_path)
    _without_arm(ev, "baseline")
    assert verify_integrity(ev, _ledger(tmp_path)) == [
        "run.json: no arms.baseline",
        "seal of candidate: sealed/candidate/ no longer matches its manifest: 1 changed (README.md)",
    ]


def test_a_seal_that_cannot_be_read_is_named_and_the_other_arm_still_checked(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    manifest = run_dir / "sealed" / "baseline.manifest.json"
    manifest.unlink()
    (run_dir / "sealed" / "candidate" / "train" / "online_rl.py").write_text("# edited\n")
    assert verify_integrity(_evidence(tmp_path), _ledger(tmp_path)) == [
        f"seal of baseline: {manifest}: cannot read the commitment (No such file or directory); run `orch freeze` "
        "first",
        "seal of candidate: sealed/candidate/ no longer matches its manifest: 1 changed (train/online_rl.py)",
        "seal of candidate: the sealed sources do not hash to run.json's sources_root",
        f"seal of candidate: sealed sources {_tree_sources(run_dir, 'candidate')[:16]} are not the commitment "
        f"{_recorded(run_dir, 'candidate', 'commitment_root')[:16]} and the arm is not declared under evaluation",
    ]


def _recorded(run_dir: Path, arm: str, key: str) -> str:
    value: str = json.loads((run_dir / "run.json").read_text())["arms"][arm][key]
    return value


def _tree_sources(run_dir: Path, arm: str) -> str:
    from manifests.core import hash_tree

    return hash_tree(run_dir / "sealed" / arm, ["train/**/*.py"]).root


def test_the_seal_covers_the_whole_copy_and_the_sources_only_the_protocols_includes(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    # README.md is sealed but not a source: the seal fails, the sources (train/**/*.py) still hash as recorded
    (run_dir / "sealed" / "baseline" / "README.md").write_text("# edited\n")
    (run_dir / "sealed" / "baseline" / "train" / "extra.txt").write_text("new\n")
    assert verify_integrity(_evidence(tmp_path), _ledger(tmp_path)) == [
        "seal of baseline: sealed/baseline/ no longer matches its manifest: 1 changed (README.md); "
        "1 added (train/extra.txt)",  # manifests' summary: changed, then added, then removed
    ]


def test_an_arm_under_evaluation_may_differ_from_its_commitment(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    ev.run = ev.run.with_arm("candidate", commitment_root="cd" * 32)
    doc = ev.protocol.model_dump(by_alias=True)
    doc["arms"]["candidate"]["under_evaluation"] = True
    ev.protocol = Protocol.model_validate(doc)
    assert verify_integrity(ev, _ledger(tmp_path)) == []
    ev.run = ev.run.with_arm("baseline", commitment_root="cd" * 32)  # the baseline is not under evaluation
    sources = ev.run.arms["baseline"].sources_root
    assert verify_integrity(ev, _ledger(tmp_path)) == [
        f"seal of baseline: sealed sources {sources[:16]} are not the commitment cdcdcdcdcdcdcdcd and the arm is not "
        "declared under evaluation"]


def _entry_sha(ev: RunEvidence, name: str, sha: str | None) -> None:
    entry = ev.run.package(name)
    assert entry is not None
    ev.run = ev.run.with_package(entry.model_copy(update={"result_sha256": sha}))


def test_run_json_may_leave_a_result_digest_out_or_leave_a_package_out(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    _entry_sha(ev, "reload-C", None)
    ev.run = ev.run.updated(packages=[p for p in ev.run.packages if p.name != "train-B"])
    assert verify_integrity(ev, _ledger(tmp_path)) == []


def test_run_jsons_score_digest_may_be_its_result_or_its_sealed_file(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    ev = _evidence(tmp_path)
    sealed = _sha((run_dir / "score.sealed.json").read_bytes())
    result = _sha((run_dir / "packages" / "score" / "result.json").read_bytes())
    assert sealed != result and ev.closes["score"].result_digest == sealed
    for sha in (sealed, result):
        _entry_sha(ev, "score", sha)
        assert verify_integrity(ev, _ledger(tmp_path)) == []
    _entry_sha(ev, "score", "0" * 64)
    _entry_sha(ev, "checks", sealed)  # any other package: only its result's digest
    assert verify_integrity(ev, _ledger(tmp_path)) == [
        "run.json: result_sha256 of checks is not the digest of its result",
        "run.json: result_sha256 of score is not the digest of its result",
    ]


def test_a_score_result_naming_another_sealed_digest_is_named(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    ev.score = ev.score.model_copy(update={"sealed_sha256": "0" * 64})
    assert verify_integrity(ev, _ledger(tmp_path)) == [
        "score.sealed.json: its sha256 is not the ledger's result digest of score"]


def test_an_altered_sealed_score_is_named(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    sealed = run_dir / "score.sealed.json"
    sealed.chmod(0o600)
    sealed.write_text(json.dumps({"dev_geneval": 0.99}))
    assert verify_integrity(_evidence(tmp_path), _ledger(tmp_path)) == [
        "score.sealed.json: its sha256 is not the ledger's result digest of score"]


def test_a_sealed_score_replaced_by_a_folder_is_missing(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    ev = _evidence(tmp_path)
    sealed = run_dir / "score.sealed.json"
    sealed.chmod(0o600)
    sealed.unlink()
    sealed.mkdir()
    assert verify_integrity(ev, _ledger(tmp_path)) == ["score.sealed.json: missing"]


def test_a_result_whose_digest_is_not_the_ledgers_is_named_for_every_package_but_score(tmp_path: Path) -> None:
    make_run(tmp_path)
    ev = _evidence(tmp_path)
    ev.result_sha256 = {**ev.result_sha256, "checks": "1" * 64, "watch-C": "2" * 64, "score": "3" * 64}
    assert verify_integrity(ev, _ledger(tmp_path)) == [
        "packages/checks/result.json: sha256 is not the ledger's result digest",
        "run.json: result_sha256 of checks is not the digest of its result",
        "packages/watch-C/result.json: sha256 is not the ledger's result digest",
        "run.json: result_sha256 of watch-C is not the digest of its result",
        # score's result.json is not what the ledger seals (that is score.sealed.json), only run.json's digest
        "run.json: result_sha256 of score is not the digest of its result",
    ]


def test_the_replays_step_files_are_checked_too(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    for name, rank in (("watch-C", 1), ("train-A", 0)):
        path = run_dir / "packages" / name / f"steps.rank{rank}.jsonl"
        path.write_text(path.read_text() + "\n")  # a blank line: the same steps, other bytes
    assert verify_integrity(_evidence(tmp_path), _ledger(tmp_path)) == [
        "packages/train-A/steps.rank0.jsonl: sha256 is not the one train-A reported",
        "packages/watch-C/steps.rank1.jsonl: sha256 is not the one watch-C reported",
    ]


def test_every_problem_at_once_in_order(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    proto = run_dir / "protocol.json"
    proto.write_text(json.dumps(json.loads(proto.read_text()), indent=2))
    steps = run_dir / "packages" / "train-B" / "steps.rank1.jsonl"
    steps.write_text(steps.read_text() + "\n")
    ev = _evidence(tmp_path)
    ev.result_sha256 = {**ev.result_sha256, "reload-A": "1" * 64}
    _without_arm(ev, "candidate")
    bad: Any = _Verified(_Report(False, "the ledger is torn"))
    assert verify_integrity(ev, bad) == [
        "the ledger is torn; run `orch ledger verify` for details",
        "protocol.json: its sha256 is not run.json's protocol_id (the protocol copy was altered)",
        "run.json: no arms.candidate",
        "packages/reload-A/result.json: sha256 is not the ledger's result digest",
        "run.json: result_sha256 of reload-A is not the digest of its result",
        "packages/train-B/steps.rank1.jsonl: sha256 is not the one train-B reported",
    ]
