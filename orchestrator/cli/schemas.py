"""`orch schema --kind ...`: the JSON Schema of each document orch reads or writes, from its pydantic model."""

from __future__ import annotations

from typing import Any

from protocol.errors import UsageError

SCHEMA_KINDS = ("protocol", "recipe", "audit", "calibration", "evidence", "gpu-run", "ledger-record")


def schema_document(kind: str) -> dict[str, Any]:
    """The JSON Schema of one document: protocol.yaml, a recipe file (orch.recipe/1), audit.json, calibration.json
    (orch.calibration/2), evidence, gpu-run record, ledger record."""
    schema: dict[str, Any]
    if kind == "protocol":
        from protocol.schema import json_schema

        schema = json_schema()
    elif kind == "recipe":
        from protocol.recipe import RecipeFile

        schema = RecipeFile.model_json_schema(by_alias=True)
    elif kind == "calibration":
        from ledger.verdict.decide.calibration import Calibration

        schema = Calibration.model_json_schema(by_alias=True)
    elif kind == "audit":
        from protocol.audit_doc import AuditDocument

        schema = AuditDocument.model_json_schema(by_alias=True)
    elif kind == "evidence":
        from protocol.audit_doc import EvidenceDocument

        schema = EvidenceDocument.model_json_schema(by_alias=True)
    elif kind == "gpu-run":
        from protocol.gpu_record import GpuRunRecord

        schema = GpuRunRecord.model_json_schema(by_alias=True)
    elif kind == "ledger-record":
        from ledger.cost.record import LedgerRecordV2

        schema = LedgerRecordV2.model_json_schema()
    else:
        raise UsageError(f"--kind {kind!r} is not one of {', '.join(SCHEMA_KINDS)}")
    return schema
