"""The audit's evidence collection refuses what run.json says is not complete, even with every result present."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_audit import WRITTEN, make_run

from ledger.verdict.decide.evidence import IncompleteRunError
from ledger.verdict.documents.audit import audit_run


@pytest.mark.parametrize("status", ["interrupted", "failed", "running"])
def test_a_run_whose_run_json_is_not_complete_is_not_audited_with_all_results_present(
    tmp_path: Path, status: str
) -> None:
    run_dir = make_run(tmp_path)  # complete: every package ok in the ledger, every result and step file present
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "status": status}))
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.problems == [f"run status is '{status}', not 'complete'"]
    assert err.value.message == ("run run1 is not complete (1 problem(s)); no audit was written and no score is "
                                 "shown; relaunch the protocol for a complete run")
    assert not any((run_dir / name).exists() for name in WRITTEN)


def test_a_run_json_of_another_run_is_not_audited(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path)
    doc = json.loads((run_dir / "run.json").read_text())
    (run_dir / "run.json").write_text(json.dumps({**doc, "run_id": "run2"}))
    with pytest.raises(IncompleteRunError) as err:
        audit_run(tmp_path, "run1")
    assert err.value.problems == ["run.json: run_id 'run2' is not 'run1'"]
    assert not (run_dir / "audit.json").exists()
