"""A/A calibrations (`orch calibrate`): this host's noise floor for one workload, and finding it for an audit.

A calibration is used only for the same protocol id on the same host (salted hash and fingerprint), never another.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledger.cost.record import LedgerRecord

CALIBRATION_SCHEMA = "orch.calibration/1"
CALIBRATION_FILE = "calibration.json"
# fingerprint keys that must be equal for a calibration to speak for this host (versions change the noise too)
FINGERPRINT_KEYS = ("host_hash", "gpu_model", "gpu_count", "driver", "cuda", "torch", "triton", "python")


class Calibration(BaseModel):
    """What an A/A run measured: the null's per-triplet headlines, its interval and its variance components."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str = Field(CALIBRATION_SCHEMA, alias="schema")
    run_id: str  # the A/A run
    of_protocol_id: str  # the workload it calibrates (the protocol as given to `orch calibrate`)
    of_protocol_name: str
    aa_protocol_id: str  # the protocol that ran: candidate arm replaced by the baseline
    host: dict[str, str]  # the host fingerprint of the A/A run (salted host hash, versions)
    repeats: int
    headlines: list[float]
    estimate: float
    low: float | None
    high: float | None
    level: float
    launch_sd: float
    launch_level_sd: float
    window_level_sd: float
    triplets_for_5pct: int | None
    recorded_at: str

    @property
    def covers_one(self) -> bool:
        return (self.low is None or self.low <= 1.0) and (self.high is None or 1.0 <= self.high)


def fingerprint(host: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(host[k]) for k in FINGERPRINT_KEYS if k in host}


def find_calibration(
    runs_dir: Path, records: Sequence[LedgerRecord], protocol_id: str, host: Mapping[str, Any], before_seq: int | None
) -> dict[str, Any]:
    """The latest calibration of this protocol id on this host recorded before `before_seq`, as an audit block.

    Only ledger records count (kind calibration, this protocol id, this host hash); the file must hash to the
    record's digest and its fingerprint must equal this run's. A calibration of another host or protocol is
    never used; the block says why none is shown.
    """
    wanted = fingerprint(host)
    stale: list[str] = []
    for rec in reversed(records):
        if rec.kind != "calibration" or rec.status != "ok" or rec.protocol_id != protocol_id:
            continue
        if before_seq is not None and rec.seq >= before_seq:
            continue
        if rec.host != wanted.get("host_hash"):
            continue
        path = runs_dir / rec.run_id / CALIBRATION_FILE
        try:
            data = path.read_bytes()
            cal = Calibration.model_validate_json(data)
        except (OSError, ValidationError):
            stale.append(f"run {rec.run_id}: calibration.json missing or malformed")
            continue
        if hashlib.sha256(data).hexdigest() != rec.result_digest:
            stale.append(f"run {rec.run_id}: calibration.json does not hash to its ledger record")
            continue
        if cal.of_protocol_id != protocol_id or fingerprint(cal.host) != wanted:
            changed = sorted(k for k in set(wanted) | set(cal.host) if wanted.get(k) != cal.host.get(k))
            stale.append(f"run {rec.run_id}: host fingerprint differs ({', '.join(changed)})")
            continue
        return {"found": True, "run_id": cal.run_id, "seq": rec.seq, **_summary(cal), "words": _words(cal)}
    why = "; ".join(stale) if stale else "none recorded for this protocol on this host before this run"
    return {"found": False, "words": f"no A/A calibration ({why}); run `orch calibrate` to measure this host"}


def _summary(cal: Calibration) -> dict[str, Any]:
    return {
        "repeats": cal.repeats,
        "headlines": cal.headlines,
        "estimate": cal.estimate,
        "low": cal.low,
        "high": cal.high,
        "level": cal.level,
        "launch_sd": cal.launch_sd,
        "launch_level_sd": cal.launch_level_sd,
        "window_level_sd": cal.window_level_sd,
        "covers_one": cal.covers_one,
        "recorded_at": cal.recorded_at,
    }


def _words(cal: Calibration) -> str:
    heads = " / ".join(f"{h:.4f}" for h in cal.headlines)
    low = "0" if cal.low is None else f"{cal.low:.4f}"
    high = "inf" if cal.high is None else f"{cal.high:.4f}"
    bias = "covers 1" if cal.covers_one else "EXCLUDES 1: this host shows a difference between identical arms"
    return (
        f"A/A run {cal.run_id} on this host ({cal.repeats} triplet(s)): null headlines {heads}, speedup "
        f"{cal.estimate:.4f}x in [{low}, {high}] ({cal.level:.0%}), which {bias}; launch-level SD "
        f"{cal.launch_level_sd:.4f}, window-level SD {cal.window_level_sd:.4f} (log scale)"
    )
