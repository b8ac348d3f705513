"""protocol/gpu_record.py: the `gpu-run --record` document, validated field by field."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from protocol.gpu_record import GpuRunRecord

OK = {"schema": "gpu-run.record/1", "kind": "gpu", "devices": [0, 3], "lock_wait_s": 1.5, "held_s": 10.0,
      "gpu_seconds": 20.0, "exit_status": 0, "started": "2026-12-01T10:00:00.000001Z",
      "acquired": "2026-12-01T10:00:01.500001Z", "ended": "2026-12-01T10:00:11.500001Z"}  # fmt: skip


def test_a_grant_and_a_lock_timeout_are_records() -> None:
    rec = GpuRunRecord.model_validate(OK)
    assert (rec.schema_, rec.devices, rec.gpu_seconds) == ("gpu-run.record/1", [0, 3], 20.0)
    timeout = GpuRunRecord.model_validate({**OK, "devices": [], "acquired": None, "held_s": 0.0, "gpu_seconds": 0.0,
                                           "exit_status": 75, "kind": "cpu-slot"})
    assert timeout.acquired is None and timeout.exit_status == 75


@pytest.mark.parametrize(
    "bad",
    [{"started": "2026-12-01T10:00:00Z"},  # UTC with microseconds and Z only
     {"ended": "2026-12-01 10:00:11.500001"}, {"held_s": -0.1}, {"lock_wait_s": -1}, {"kind": "tpu"},
     {"schema": "gpu-run.record/2"}, {"extra": 1}],
)  # fmt: skip
def test_what_is_not_a_record_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GpuRunRecord.model_validate({**OK, **bad})


def test_a_record_is_frozen() -> None:
    rec = GpuRunRecord.model_validate(OK)
    with pytest.raises(ValidationError):
        rec.kind = "cpu-slot"  # type: ignore[misc]
