"""protocol/audit_doc.py: the published shape of audit.json describes what the audit writes, the recorded run's
audit and an A/A run's alike; orchestrator/cli/schemas.py prints it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.cli.schemas import SCHEMA_KINDS, schema_document
from protocol.audit_doc import AuditDocument
from protocol.errors import UsageError

GOLDEN_AUDIT = Path(__file__).resolve().parents[1] / "golden" / "home" / "runs" / "20261201T151531Z-65f0dacd-f08f" \
    / "audit.json"


def test_the_recorded_audit_is_an_audit_document() -> None:
    doc = json.loads(GOLDEN_AUDIT.read_bytes())
    audit = AuditDocument.model_validate(doc)
    assert (audit.verdict, audit.calibration_of, audit.exact) == ("no difference shown", None, True)


def test_an_a_a_audit_names_the_protocol_it_calibrates() -> None:
    doc = json.loads(GOLDEN_AUDIT.read_bytes())
    of = {"protocol_id": "65f0dacd" + "0" * 56, "protocol_name": "r3-mini-cpu2"}
    audit = AuditDocument.model_validate({**doc, "calibration_of": of})  # what documents/document.py writes
    assert audit.calibration_of is not None and audit.calibration_of.protocol_name == "r3-mini-cpu2"
    with pytest.raises(ValidationError):
        AuditDocument.model_validate({**doc, "calibration_of": {"protocol_id": "x"}})
    with pytest.raises(ValidationError):
        AuditDocument.model_validate({**doc, "unknown": 1})


def test_each_kind_has_a_json_schema_and_another_kind_is_a_usage_error() -> None:
    for kind in SCHEMA_KINDS:
        assert schema_document(kind)["type"] == "object"
    audit = schema_document("audit")
    assert {"run_id", "verdict", "exactness", "ledger_head"} <= set(audit["required"])
    assert "CalibrationOf" in json.dumps(audit["properties"]["calibration_of"])
    recipe = schema_document("recipe")  # a recipe file: its keys, each with value, flag and observation
    assert {"keys"} <= set(recipe["required"]) and "RecipeKey" in json.dumps(recipe)
    calibration = schema_document("calibration")
    assert {"sd", "df", "log_speedups", "of_protocol_id"} <= set(calibration["required"])
    assert "workload_id" in calibration["properties"]
    with pytest.raises(UsageError, match=r"^--kind 'nope' is not one of protocol, recipe, audit, calibration, "
                                         r"evidence, gpu-run, ledger-record$"):
        schema_document("nope")
