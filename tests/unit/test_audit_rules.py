"""ledger/verdict/documents/audit.py rule by rule, in process: the refusal of evidence that does not verify, the audit's
own ledger record, re-audits (recorded evidence is never rewritten, missing renderings come back, nothing recorded
twice), the unsealing of the DEV score only after the record, and `orch audit`'s command function (what it prints,
returns and refuses). Runs are fabricated by test_audit.make_run; every expected value is written out by hand.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_audit import SCORE, WRITTEN, RunSpec, make_run, record_calibration, synthetic_protocol_id

from ledger.cost.store import Ledger
from ledger.cost.witness import WITNESS_FILE
from ledger.verdict.decide.evidence import IncompleteRunError
from ledger.verdict.documents import audit
from ledger.verdict.documents.audit import _differing_keys, audit_command, audit_run, unseal_score
from ledger.verdict.documents.document import AUDIT_UNITS, DevScore, canonical_bytes
from protocol.errors import FailedError
from protocol.home import resolve_home


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _ledger(home: Path) -> Ledger:
    return Ledger(resolve_home(home).ledger_path)


def _witness_lines(home: Path) -> list[dict[str, Any]]:
    path = resolve_home(home).witness_dir / WITNESS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_differing_keys_are_the_sorted_keys_whose_values_differ_a_missing_key_read_as_none() -> None:
    a = {"z": 1, "same": [1, 2], "only_a": 0, "none_a": None}
    b = {"z": 2, "same": [1, 2], "only_b": "x", "b_none": None}
    assert _differing_keys(a, b) == ["only_a", "only_b", "z"]
    assert _differing_keys(b, a) == ["only_a", "only_b", "z"]
    assert _differing_keys({}, {}) == []



def test_a_total_summed_under_another_python_agrees_and_a_changed_figure_does_not() -> None:
    # the rehearsal of 2026-12-04: audited under Python 3.12 on the device (compensated sum()), re-audited under 3.11
    seconds = [4.217841, 455.530908, 200.818328, 6.171766, 145.098997, 5.11875, 141.692967, 6.070663, 166.338387,
               6.722725]
    plain = 0.0
    for s in seconds:
        plain += s
    exact = math.fsum(seconds)
    assert plain != exact  # the two summations really differ in the last bits
    recorded = {"cost": {"total_gpu_seconds": exact, "gpu_seconds": {"train-A": 200.818328}}, "exact": True}
    assert _differing_keys(recorded, {"cost": {"total_gpu_seconds": plain, "gpu_seconds": {"train-A": 200.818328}},
                                      "exact": True}) == []
    # a figure of the evidence that moved by a microsecond in 200 s is a difference
    assert _differing_keys(recorded, {"cost": {"total_gpu_seconds": exact, "gpu_seconds": {"train-A": 200.818329}},
                                      "exact": True}) == ["cost"]
    # flags, structure and strings compare exactly: True is not 1, a shorter list or another key differs
    assert _differing_keys({"exact": True}, {"exact": 1}) == ["exact"]
    assert _differing_keys({"w": [1.0, 2.0]}, {"w": [1.0]}) == ["w"]
    assert _differing_keys({"w": {"a": 1.0}}, {"w": {"b": 1.0}}) == ["w"]
    assert _differing_keys({"w": ["x", 0.5]}, {"w": ["y", 0.5]}) == ["w"]
    assert _differing_keys({"w": 0.0}, {"w": 1e-13}) == []
    assert _differing_keys({"w": 0.0}, {"w": 1e-9}) == ["w"]
    assert _differing_keys({"w": 1.0}, {"w": 1.0 + 5e-10}) == ["w"]  # beyond rounding, though math.isclose's default
    assert _differing_keys({"w": 2}, {"w": 2.0}) == [] and _differing_keys({"w": None}, {"w": None}) == []
    # values of another kind never agree, whatever they hold
    assert _differing_keys({"w": None}, {"w": 0.0}) == ["w"] and _differing_keys({"w": 0.0}, {"w": None}) == ["w"]
    assert _differing_keys({"w": 1.0}, {"w": "1.0"}) == ["w"] and _differing_keys({"w": "1.0"}, {"w": 1.0}) == ["w"]
    assert _differing_keys({"w": {"a": 1.0}}, {"w": ["a"]}) == ["w"]
    assert _differing_keys({"w": ["a"]}, {"w": {"a": 1.0}}) == ["w"]
    assert _differing_keys({"w": ["x"]}, {"w": "x"}) == ["w"] and _differing_keys({"w": "x"}, {"w": ["x"]}) == ["w"]
    assert _differing_keys({"w": (1.0, "x")}, {"w": [1.0, "x"]}) == []  # a tuple read back from JSON is a list

# --- unseal_score -----------------------------------------------------------------------------------------------


def _score_ev(tmp_path: Path, data: bytes, digest: str) -> Any:
    (tmp_path / "score.sealed.json").write_bytes(data)
    return SimpleNamespace(run_dir=tmp_path, closes={"score": SimpleNamespace(result_digest=digest)})


def test_the_sealed_score_is_shown_only_when_it_hashes_to_the_ledgers_digest(tmp_path: Path) -> None:
    data = b'{"dev_geneval": 0.5}\n'
    sha = "a7d2a0c6f0de7fd3f4ab3c1d8e2e93d4b0c2c8a46f3f68a1c2c7e0e9d1b1a4f2"  # not the bytes' sha256
    assert unseal_score(_score_ev(tmp_path, data, sha)) == DevScore(
        _sha(data), False, None, "score.sealed.json does not match the ledger's digest; not shown")
    assert unseal_score(_score_ev(tmp_path, data, _sha(data))) == DevScore(
        _sha(data), True, {"dev_geneval": 0.5}, "informational: not part of the verdict, never published")


def test_a_sealed_score_that_is_not_json_is_shown_as_text(tmp_path: Path) -> None:
    data = b"\xffgeneval 0.5"
    assert unseal_score(_score_ev(tmp_path, data, _sha(data))) == DevScore(
        _sha(data), True, "\ufffdgeneval 0.5", "informational: not part of the verdict, never published")


# --- audit_run ------------------------------------------------------------------------------------------------------


def test_evidence_that_does_not_verify_is_refused_with_its_count_and_nothing_written(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    (run_dir / "sealed" / "baseline" / "README.md").write_text("# edited\n")
    steps = run_dir / "packages" / "train-A" / "steps.rank0.jsonl"
    steps.write_text(steps.read_text() + "\n")
    before = len(_ledger(tmp_path).records())
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.message == (
        "run run1: the evidence does not verify (2 problem(s)); no audit was written and no score is shown; the run "
        "directory or ledger was altered")
    assert err.value.problems == [
        "seal of baseline: sealed/baseline/ no longer matches its manifest: 1 changed (README.md)",
        "packages/train-A/steps.rank0.jsonl: sha256 is not the one train-A reported",
    ]
    assert not any((run_dir / name).exists() for name in WRITTEN)
    assert len(_ledger(tmp_path).records()) == before and _witness_lines(tmp_path) == []


class _Clock:
    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def time(self) -> float:
        return self.values.pop(0)


def test_the_audit_is_recorded_in_the_ledger_with_its_verdict_digest_and_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))
    make_run(tmp_path, "run2", RunSpec(diverge=("C", 5, 1, "w.step")))
    head = _ledger(tmp_path).head()
    # 1 700 000 000 s is 2023-11-14 22:13:20 UTC; the audit took 12.5 s
    monkeypatch.setattr(audit, "time", _Clock(1_700_000_000.0, 1_700_000_012.5))
    result = audit_run(tmp_path, "run1")
    data = (run_dir / "audit.json").read_bytes()
    rec = _ledger(tmp_path).records()[-1]
    recorded = json.loads((run_dir / "run.json").read_text())
    assert (rec.run_id, rec.package, rec.kind, rec.arm, rec.status) == ("run1", "audit", "audit", None, "accepted")
    assert (rec.started, rec.ended, rec.wall_s) == ("2023-11-14T22:13:20.000000Z", "2023-11-14T22:13:32.500000Z", 12.5)
    assert (rec.gpus, rec.gpu_seconds, rec.lock_wait_s) == (0, 0.0, 0.0)
    assert rec.protocol_id == recorded["protocol_id"]
    assert rec.sources_root == recorded["arms"]["candidate"]["commitment_root"]
    assert rec.sources_root != recorded["arms"]["baseline"]["commitment_root"]
    # d = ln 2, calibration SD 0.05 df 4, its A/A mean (0) over 5 launches subtracted, variance carried (issue 52):
    # 2 exp(+-2.7764 x 0.05 x sqrt(1 + 1/5)) = [1.7179, 2.3285]
    assert (rec.result_digest, rec.exit_code, rec.note) == (
        _sha(data), 0, "verdict: accepted (faster); speedup 2.0000x [1.7179, 2.3285] 95%, K=1, df 4, SD of A/A run "
        "cal-run1")
    assert result.ledger_seq == rec.seq == head.size  # the first record after the head the audit saw
    assert result.document["ledger_head"] == {"size": head.size, "root": head.root}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", result.document["audited_at"])
    assert (result.audit_path, result.markdown_path, result.plot_path) == tuple(run_dir / n for n in WRITTEN)
    assert result.written is True and result.notes == [] and result.run_id == "run1"
    assert [w["by"] for w in _witness_lines(tmp_path)] == ["audit run1"]
    assert _witness_lines(tmp_path)[0]["size"] == head.size + 1  # the head with the audit record in it

    monkeypatch.setattr(audit, "time", _Clock(1_700_000_100.0, 1_700_000_101.0))
    other = audit_run(tmp_path, "run2")
    rec = _ledger(tmp_path).records()[-1]
    assert other.verdict == "not exact"
    assert (rec.run_id, rec.status, rec.exit_code, rec.note) == ("run2", "not exact", 1, "verdict: not exact")
    assert rec.wall_s == 1.0 and rec.result_digest == _sha((tmp_path / "runs" / "run2" / "audit.json").read_bytes())


def test_a_re_audit_records_nothing_twice_and_writes_back_only_missing_renderings(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))
    first = audit_run(tmp_path, "run1")
    data = (run_dir / "audit.json").read_bytes()
    size = len(_ledger(tmp_path).records())
    (run_dir / "audit.md").write_text("kept as it is\n")
    (run_dir / "step_times.png").unlink()
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.ledger_seq == first.ledger_seq
    assert again.notes == ["audit.json was already recorded; the recomputation equals it, shown unchanged"]
    assert again.document == json.loads(data) and (run_dir / "audit.json").read_bytes() == data
    assert (run_dir / "audit.md").read_text() == "kept as it is\n"
    assert (run_dir / "step_times.png").read_bytes().startswith(b"\x89PNG")
    assert len(_ledger(tmp_path).records()) == size and len(_witness_lines(tmp_path)) == 1
    (run_dir / "audit.md").unlink()
    audit_run(tmp_path, "run1")
    assert "accepted" in (run_dir / "audit.md").read_text()
    assert again.score == DevScore(_sha((run_dir / "score.sealed.json").read_bytes()), True, SCORE,
                                   "informational: not part of the verdict, never published")


def test_a_re_audit_records_the_digest_of_the_bytes_on_disk(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    first = audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_bytes())
    other_bytes = json.dumps(doc, indent=3).encode()  # the same document, not in canonical form
    assert other_bytes != canonical_bytes(doc)
    (run_dir / "audit.json").write_bytes(other_bytes)
    again = audit_run(tmp_path, "run1")
    rec = _ledger(tmp_path).records()[-1]
    assert not again.written and (run_dir / "audit.json").read_bytes() == other_bytes
    assert again.ledger_seq == rec.seq == first.ledger_seq + 1 and rec.result_digest == _sha(other_bytes)


def test_a_recorded_audit_differing_in_two_sections_names_both_sorted(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_text())
    doc["verdict"], doc["scope"] = "noisy", "another scope"
    (run_dir / "audit.json").write_bytes(canonical_bytes(doc))
    with pytest.raises(FailedError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.message == (
        "run run1: the recorded audit.json differs from a recomputation in scope, verdict; recorded evidence is "
        "never rewritten: find out what changed in the run directory")


def test_a_re_audit_after_a_later_calibration_is_unchanged(tmp_path: Path) -> None:
    # the calibration counts only when recorded before the run's FIRST record: the run's own audit record, appended
    # after the calibration, does not let it in on a re-audit
    make_run(tmp_path, "run1")
    record_calibration(tmp_path, "cal1", synthetic_protocol_id())
    first = audit_run(tmp_path, "run1").document
    assert first["calibration"]["found"] is False and first["interval"]["bounded"] is False
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.document["calibration"]["found"] is False
    make_run(tmp_path, "run2")
    doc = audit_run(tmp_path, "run2").document
    assert doc["calibration"]["found"] is True and doc["calibration"]["run_id"] == "cal1"
    assert doc["interval"]["variance_source"] == "calibration" and doc["verdict"] == "accepted"


# --- audit_command ---------------------------------------------------------------------------------------------------


def test_the_command_prints_the_report_and_returns_the_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))
    out = audit_command("run1", tmp_path)
    doc = json.loads((run_dir / "audit.json").read_bytes())
    rec = _ledger(tmp_path).records()[-1]
    assert out == {
        "audit": doc, "written": True, "ledger_seq": rec.seq, "exit_code": 0, "units": AUDIT_UNITS,
        "dev_score": {"informational": True, "verified": True,
                      "sha256": _sha((run_dir / "score.sealed.json").read_bytes()), "metrics": SCORE},
    }
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("verdict: accepted (faster)  run run1  headline 2.0000x (w1), speedup 2.0000x in "
                                 "[1.7179, 2.3285] (95%)")
    assert not any("missing or failed" in line for line in printed)
    assert audit_command("run1", tmp_path)["written"] is False


def test_the_command_prints_each_problem_as_one_unstyled_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")  # a colour terminal: rich would highlight numbers and quotes if asked
    run_dir = make_run(tmp_path, spec=RunSpec(stop_at="train-C"))
    doc = json.loads((run_dir / "run.json").read_text())
    other = "[bold]run0[/bold]-" + "x" * 90  # markup words and a name longer than the 80 columns of a pipe
    (run_dir / "run.json").write_text(json.dumps({**doc, "run_id": other}))
    with pytest.raises(IncompleteRunError) as err:
        audit_command("run1", tmp_path)
    problems = [
        f"run.json: run_id '{other}' is not 'run1'",
        "run status is 'interrupted', not 'complete'",
        "package train-C: interrupted (exit -15)",
        "package reload-C: not-run: not reached",
        "package train-B: not-run: not reached",
        "package reload-B: not-run: not reached",
        "package watch-C: not-run: not reached",
        "package score: not-run: not reached",
    ]
    assert capsys.readouterr().out.splitlines() == [f"missing or failed: {p}" for p in problems]
    assert err.value.document == {"run_id": "run1", "audit": None, "problems": problems}


def test_the_command_fails_a_run_that_is_not_exact_with_its_first_reason(tmp_path: Path) -> None:
    make_run(tmp_path, spec=RunSpec(diverge=("C", 5, 1, "w.exp_avg_sq")))
    with pytest.raises(FailedError) as err:
        audit_command("run1", tmp_path)
    doc = err.value.document
    assert doc is not None and doc["exit_code"] == 1 and doc["audit"]["verdict"] == "not exact"
    assert doc["dev_score"]["verified"] is True  # complete evidence: the score is shown after the record
    first = doc["audit"]["reasons"][0]
    assert first.startswith("digests mismatch at step 5, rank 1, tensor w.exp_avg_sq")
    assert err.value.message == f"run run1: audit verdict not exact: {first}"


def test_no_difference_shown_is_not_a_failure_of_the_command(tmp_path: Path) -> None:
    spec = RunSpec()
    spec.durations["B"] = [0.2] * 12 + [0.3] * 4  # test_audit's worked case: one triplet, not bounded
    make_run(tmp_path, spec=spec)
    out = audit_command("run1", tmp_path)
    assert out["audit"]["verdict"] == "no difference shown" and out["exit_code"] == 0


def test_a_sealed_score_changed_after_the_checks_is_refused_after_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = make_run(tmp_path, spec=RunSpec(calibrated=True))
    sealed = run_dir / "score.sealed.json"
    plot = audit.plot_step_times

    def plot_then_alter(doc: Any, path: Path) -> None:  # between the integrity checks and the unsealing
        plot(doc, path)
        sealed.chmod(0o600)
        sealed.write_text('{"dev_geneval": 0.99}\n')

    monkeypatch.setattr(audit, "plot_step_times", plot_then_alter)
    with pytest.raises(FailedError) as err:
        audit_command("run1", tmp_path)
    assert err.value.message == "run run1: score.sealed.json does not match the ledger's digest; not shown"
    doc = err.value.document
    assert doc is not None and doc["audit"]["verdict"] == "accepted" and doc["exit_code"] == 0
    assert doc["dev_score"] == {"informational": True, "verified": False,
                                "sha256": _sha(b'{"dev_geneval": 0.99}\n'), "metrics": None}
    assert _ledger(tmp_path).records()[-1].kind == "audit"  # the verdict was recorded before the score was read


def test_an_audit_recorded_before_a_later_section_stays_as_recorded_unless_that_section_differs(
    tmp_path: Path,
) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_bytes())
    del doc["probe_cost"]  # ADDED_LATER: an audit.json recorded before the section existed lacks it
    (run_dir / "audit.json").write_bytes(canonical_bytes(doc))
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.document == doc and "probe_cost" not in again.document
    doc["probe_cost"] = {"rows": []}  # present but not what the evidence gives: refused like any other section
    (run_dir / "audit.json").write_bytes(canonical_bytes(doc))
    with pytest.raises(FailedError) as err:
        audit_run(tmp_path, "run1")
    assert "differs from a recomputation in probe_cost;" in err.value.message


def test_a_run_published_from_another_ledger_is_refused_before_anything_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # published evidence in the repository around the working folder saw run1 in a ledger with another id: the
    # ledger was replaced since (the witness check gets the repository and the run id)
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "docs" / "validation").mkdir(parents=True)
    evidence = {"ledger_id": "f" * 64, "run_id": "run1", "ledger_head": {"size": 1, "root": "0" * 64}}
    (repo / "docs" / "validation" / "run1.json").write_text(json.dumps(evidence))
    (repo / "sub").mkdir()
    monkeypatch.chdir(repo / "sub")
    run_dir = make_run(tmp_path / "home")
    with pytest.raises(FailedError) as err:
        audit_run(tmp_path / "home", "run1")
    assert err.value.message == (
        "docs/validation/run1.json saw run run1 in another ledger (ffffffffffff): the ledger that holds it was "
        "replaced since; no audit: restore the ledger from a copy"
    )
    assert not any((run_dir / name).exists() for name in WRITTEN)
    make_run(tmp_path / "home", "run2", RunSpec(calibrated=True))  # another run of this ledger is not refused by it
    assert audit_run(tmp_path / "home", "run2").verdict == "accepted"


def test_an_audit_recorded_before_paired_statistics_is_shown_compared_only_where_nothing_changed(
    tmp_path: Path,
) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_bytes())
    # what orch.audit/1 recorded for the same evidence: the unpaired interval, its verdict and words
    v1 = {**doc, "schema": "orch.audit/1", "verdict": "no difference shown", "direction": None,
          "reasons": ["the 95% interval [0.6875, 18.5979] of the speedup covers 1: no speed difference is shown"],
          "interval": {"estimate": 2.0, "low": 0.6875, "high": 18.5979, "level": 0.95, "method": "unpaired", "df": 1,
                       "words": "w", "variance": {"launch_sd": 0.1, "launch_level_sd": 0.1, "window_level_sd": 0.0}},
          "replication": {"repeats": 1, "headlines": [2.0], "triplets": []},
          "calibration": {"found": False, "words": "no A/A calibration"}, "diagnostics": []}
    (run_dir / "audit.json").write_bytes(canonical_bytes(v1))
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.document == v1 and again.verdict == "no difference shown"
    assert again.notes == [
        "audit.json was recorded as orch.audit/1, before paired statistics: a recomputation equals it on every part "
        "but the statistics (verdict, interval, per-triplet figures, calibration, reasons, diagnostics), which are "
        "shown as recorded"]
    # a part whose computation did not change is still compared: a /1 audit that differs there is refused
    (run_dir / "audit.json").write_bytes(canonical_bytes({**v1, "exact": False}))
    with pytest.raises(FailedError, match="differs from a recomputation in exact;"):
        audit_run(tmp_path, "run1")
    # and a /2 audit is compared on its statistics too
    (run_dir / "audit.json").write_bytes(canonical_bytes({**doc, "interval": v1["interval"]}))
    with pytest.raises(FailedError, match="differs from a recomputation in interval;"):
        audit_run(tmp_path, "run1")


def test_an_audit_recorded_under_earlier_statistics_rules_is_named_so_not_as_a_v1_audit(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    audit_run(tmp_path, "run1")
    doc = json.loads((run_dir / "audit.json").read_bytes())
    earlier = {**doc, "statistics_rules": "issue-34", "reasons": ["recorded under the rules of issue 34"]}
    (run_dir / "audit.json").write_bytes(canonical_bytes(earlier))
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.document == earlier
    assert again.notes == [
        "audit.json was recorded under statistics rules before issue-50: a recomputation equals it on every part but "
        "the statistics (verdict, interval, per-triplet figures, calibration, reasons, diagnostics), which are "
        "shown as recorded"]
    # issue 50: gpu_busy's expected width is a statistic too; recorded under issue-52 it is shown as recorded
    busy = {**earlier, "statistics_rules": "issue-52", "gpu_busy": {"expected": {"triplets_for_target": 5}}}
    (run_dir / "audit.json").write_bytes(canonical_bytes(busy))
    again = audit_run(tmp_path, "run1")
    assert not again.written and again.document == busy
    assert "diagnostics, GPU-busy and its expected width), which are shown as recorded" in again.notes[0]
