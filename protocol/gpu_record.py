"""The `gpu-run --record FILE` document (gpu-run.record/1): what a grant cost, for the ledger.

`orch schema --kind gpu-run` prints its JSON Schema; times are UTC ISO 8601 with microseconds and Z.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GPU_RUN_RECORD: Literal["gpu-run.record/1"] = "gpu-run.record/1"
UTC_US = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$"


class GpuRunRecord(BaseModel):
    """One gpu-run grant: devices held, waited and held seconds, CMD's exit status."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_: Literal["gpu-run.record/1"] = Field(GPU_RUN_RECORD, alias="schema")
    kind: Literal["gpu", "cpu-slot"]
    devices: list[int] = Field(description="granted GPU (or CPU slot) indices; empty when none was obtained")
    lock_wait_s: float = Field(ge=0, description="seconds waited for the lock")
    held_s: float = Field(ge=0, description="seconds the devices were held")
    gpu_seconds: float = Field(ge=0, description="held_s x number of devices (slot-seconds for CPU slots)")
    exit_status: int = Field(description="gpu-run's exit status (CMD's, 75 on a lock timeout, 128+N on signal N)")
    started: str = Field(pattern=UTC_US, description="when gpu-run started waiting (UTC)")
    acquired: str | None = Field(pattern=UTC_US, description="when the devices were granted (UTC), null if never")
    ended: str = Field(pattern=UTC_US, description="when gpu-run finished (UTC)")
