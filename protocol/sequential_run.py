"""run.json's `sequential` section: the stopping rule a sequential run (measurement.repeats: auto, or `orch launch
--until-decided`) was launched under, and each look as orch took it. The audit replays the looks from the evidence.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

StopReason = Literal["decided", "precise", "maximum"]
Asked = Literal["protocol", "--until-decided"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SequentialLook(_Strict):
    """One look: the repeated confidence interval after `triplets` triplets and what the rule said."""

    triplets: int = Field(ge=1)
    estimate: float
    low: float | None  # None: unbounded
    high: float | None
    nominal_level: float
    df: int
    variance_source: str  # pooled | run | calibration | none
    stop: StopReason | None  # None: a triplet was added


class SequentialRecord(_Strict):
    """The rule (asked by the protocol or by --until-decided), the looks taken, and how the run stopped."""

    asked: Asked
    max_triplets: int = Field(ge=1, le=32)
    target_half_width: float | None
    level: float
    calibration_run: str | None = None  # the A/A run whose spread the looks pooled (None: the run's own spread)
    looks: list[SequentialLook] = Field(default_factory=list)
    triplets: int | None = None  # triplets taken, once the rule stopped
    stop: StopReason | None = None
