"""A/A calibrations (`orch calibrate`): this host's spread between triplets for one workload, and finding it.

A calibration is used only on the same host (salted hash and fingerprint) for the same protocol id, or for a protocol
with the same baseline workload (protocol.schema.baseline_workload_id: a candidate and its null share one); never
another. One recorded before paired statistics (orch.calibration/1) is shown, never pooled.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ledger.cost.record import LedgerRecord
from ledger.verdict.stats import Spread

CALIBRATION_SCHEMA = "orch.calibration/2"
CALIBRATION_V1 = "orch.calibration/1"
CALIBRATION_FILE = "calibration.json"
# fingerprint keys that must be equal for a calibration to speak for this host (versions change the noise too)
FINGERPRINT_KEYS = ("host_hash", "gpu_model", "gpu_count", "driver", "cuda", "torch", "triton", "python")
RERUN = "re-run `orch calibrate PROTOCOL` on this host"


class Calibration(BaseModel):
    """What an A/A run measured (orch.calibration/2): the per-triplet paired log speedups of identical arms, their
    SD and df (the between-triplet spread a later audit pools), the within-triplet window spread, and the A/A mean
    (a position-bias diagnostic: identical arms should read 1)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["orch.calibration/2"] = Field("orch.calibration/2", alias="schema")
    run_id: str  # the A/A run whose folder holds this file (the last launch)
    run_ids: list[str] | None = None  # every A/A launch, one triplet each; None: one launch of `repeats` triplets
    of_protocol_id: str  # the workload it calibrates (the protocol as given to `orch calibrate`)
    of_protocol_name: str
    aa_protocol_id: str  # the protocol that ran: candidate arm replaced by the baseline
    workload_id: str | None = None  # its baseline workload (baseline_workload_id); None: recorded before it was
    host: dict[str, str]  # the host fingerprint of the A/A run (salted host hash, versions)
    repeats: int = Field(ge=2)  # A/A triplets (one per launch when run_ids is given)
    headlines: list[float]  # the owner's headline of each A/A triplet
    log_speedups: list[float]  # d of each A/A triplet (natural log)
    sd: float = Field(ge=0)  # SD of the log speedups between triplets
    df: int = Field(ge=1)
    window_sd: float | None = Field(None, ge=0)  # within-triplet SD between windows (log scale)
    window_df: int = Field(0, ge=0)
    # the baseline arm's within-launch SD of a measured step (log scale), from the step contrasts of every A/A
    # launch (ledger/verdict/noise.py); None: recorded before issue 34 (the candidate's noise is then not checked)
    step_sd: float | None = Field(None, ge=0)
    step_df: int = Field(0, ge=0)
    mean_log_speedup: float  # the A/A mean of d: near 0 unless the position in the triplet matters
    estimate: float  # exp(mean d) with the A/A run's own interval
    low: float | None
    high: float | None
    level: float
    triplets_for_5pct: int | None
    recorded_at: str

    @property
    def spread(self) -> Spread:
        return Spread(self.sd, self.df)

    @property
    def window_spread(self) -> Spread | None:
        return Spread(self.window_sd, self.window_df) if self.window_sd is not None and self.window_df else None

    @property
    def step_spread(self) -> Spread | None:
        return Spread(self.step_sd, self.step_df) if self.step_sd is not None and self.step_df else None

    @property
    def covers_one(self) -> bool:
        return (self.low is None or self.low <= 1.0) and (self.high is None or 1.0 <= self.high)


class CalibrationV1(BaseModel):
    """orch.calibration/1 (unpaired launch-level statistics, before main b90d406): read to be shown, never pooled."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["orch.calibration/1"] = Field("orch.calibration/1", alias="schema")
    run_id: str
    of_protocol_id: str
    of_protocol_name: str
    aa_protocol_id: str
    host: dict[str, str]
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


def fingerprint(host: Mapping[str, Any]) -> dict[str, str]:
    return {k: str(host[k]) for k in FINGERPRINT_KEYS if k in host}


def read_calibration(data: bytes) -> Calibration | CalibrationV1:
    """Either schema; ValueError (pydantic's ValidationError included) when it is neither."""
    schema = json.loads(data).get("schema")
    if schema == CALIBRATION_V1:
        return CalibrationV1.model_validate_json(data)
    return Calibration.model_validate_json(data)


def calibration_spreads(block: Mapping[str, Any] | None) -> tuple[Spread | None, Spread | None]:
    """(between-triplet, within-triplet window) spreads of an audit's calibration block; None where not usable."""
    if not block or not block.get("usable"):
        return None, None
    ws = block.get("window_sd")
    window = Spread(float(ws), int(block["window_df"])) if ws is not None and block.get("window_df") else None
    return Spread(float(block["sd"]), int(block["df"])), window


def calibration_step_spread(block: Mapping[str, Any] | None) -> Spread | None:
    """The baseline's within-launch step spread of an audit's calibration block; None when not usable or recorded
    before issue 34 (then the calibration is pooled unscaled, as it was)."""
    if not block or not block.get("usable") or block.get("step_sd") is None or not block.get("step_df"):
        return None
    return Spread(float(block["step_sd"]), int(block["step_df"]))


def find_calibration(
    runs_dir: Path, records: Sequence[LedgerRecord], protocol_id: str, host: Mapping[str, Any], before_seq: int | None,
    workload_id: str | None = None,
) -> dict[str, Any]:
    """The latest calibration of this protocol id, or of this baseline workload, on this host recorded before
    `before_seq`, as an audit block.

    Only ledger records count (kind calibration, this host hash, this protocol id or a calibration file naming
    `workload_id`); the file must hash to the record's digest and its fingerprint must equal this run's. A
    calibration of another host or baseline is never used; the block says why none is shown. `usable`: an
    orch.calibration/2 whose spread the audit pools.
    """
    wanted = fingerprint(host)
    stale: list[str] = []
    for rec in reversed(records):
        if rec.kind != "calibration" or rec.status != "ok":
            continue
        if rec.protocol_id != protocol_id and workload_id is None:
            continue
        if before_seq is not None and rec.seq >= before_seq:
            continue
        if rec.host != wanted.get("host_hash"):
            continue
        path = runs_dir / rec.run_id / CALIBRATION_FILE
        try:
            data = path.read_bytes()
            cal = read_calibration(data)
        except (OSError, ValueError):
            stale.append(f"run {rec.run_id}: calibration.json missing or malformed")
            continue
        if hashlib.sha256(data).hexdigest() != rec.result_digest:
            stale.append(f"run {rec.run_id}: calibration.json does not hash to its ledger record")
            continue
        same_workload = workload_id is not None and getattr(cal, "workload_id", None) == workload_id
        if cal.of_protocol_id != protocol_id and not same_workload:
            continue  # another workload's calibration
        if fingerprint(cal.host) != wanted:
            changed = sorted(k for k in set(wanted) | set(cal.host) if wanted.get(k) != cal.host.get(k))
            stale.append(f"run {rec.run_id}: host fingerprint differs ({', '.join(changed)})")
            continue
        if isinstance(cal, CalibrationV1):
            return {"found": True, "usable": False, "schema": CALIBRATION_V1, "run_id": cal.run_id, "seq": rec.seq,
                    **_summary_v1(cal), "words": _words_v1(cal)}
        shared = "" if cal.of_protocol_id == protocol_id else (
            f"; calibrated on protocol {cal.of_protocol_name} ({cal.of_protocol_id[:12]}), whose baseline workload "
            "is this run's")
        return {"found": True, "usable": True, "schema": CALIBRATION_SCHEMA, "run_id": cal.run_id, "seq": rec.seq,
                "of_protocol_id": cal.of_protocol_id, "of_protocol_name": cal.of_protocol_name,
                **_summary(cal), "words": calibration_words(cal) + shared}
    why = "; ".join(stale) if stale else "none recorded for this protocol on this host before this run"
    return {"found": False, "usable": False,
            "words": f"no A/A calibration ({why}); run `orch calibrate PROTOCOL` to measure this host"}


def _summary(cal: Calibration) -> dict[str, Any]:
    return {
        "run_ids": cal.run_ids,  # the A/A launches (None: one launch of `repeats` triplets)
        "repeats": cal.repeats,
        "headlines": cal.headlines,
        "log_speedups": cal.log_speedups,
        "sd": cal.sd,
        "df": cal.df,
        "window_sd": cal.window_sd,
        "window_df": cal.window_df,
        "mean_log_speedup": cal.mean_log_speedup,
        "estimate": cal.estimate,
        "low": cal.low,
        "high": cal.high,
        "level": cal.level,
        "covers_one": cal.covers_one,
        "recorded_at": cal.recorded_at,
        # only when recorded: an audit of a run calibrated before issue 34 recomputes to the same block
        **({"step_sd": cal.step_sd, "step_df": cal.step_df} if cal.step_sd is not None else {}),
    }


def _span(low: float | None, high: float | None) -> str:
    return f"[{'0' if low is None else f'{low:.4f}'}, {'inf' if high is None else f'{high:.4f}'}]"


def calibration_words(cal: Calibration) -> str:
    heads = " / ".join(f"{h:.4f}" for h in cal.headlines)
    bias = ("covers 1" if cal.covers_one else
            "EXCLUDES 1: identical arms read as different on this host (a position or warm-up effect)")
    window = "" if cal.window_sd is None else f", within-triplet window SD {cal.window_sd:.4f} (df {cal.window_df})"
    if cal.step_sd is not None:
        window += f", the baseline's within-launch step SD {cal.step_sd:.4f} (df {cal.step_df})"
    if cal.run_ids:
        what = (f"A/A calibration {cal.run_id} on this host ({cal.repeats} launches of one triplet): null headlines "
                f"{heads}; between-launch SD")
    else:
        what = f"A/A run {cal.run_id} on this host ({cal.repeats} triplets): null headlines {heads}; between-triplet SD"
    return (
        f"{what} {cal.sd:.4f} of the paired log speedup (df {cal.df}){window}; A/A mean {cal.estimate:.4f}x in "
        f"{_span(cal.low, cal.high)} ({cal.level:.0%}), which {bias}"
    )


def _summary_v1(cal: CalibrationV1) -> dict[str, Any]:
    return {
        "repeats": cal.repeats,
        "headlines": cal.headlines,
        "estimate": cal.estimate,
        "low": cal.low,
        "high": cal.high,
        "level": cal.level,
        "recorded_at": cal.recorded_at,
    }


def _words_v1(cal: CalibrationV1) -> str:
    heads = " / ".join(f"{h:.4f}" for h in cal.headlines)
    return (
        f"A/A run {cal.run_id} on this host ({cal.repeats} triplet(s)): null headlines {heads}, speedup "
        f"{cal.estimate:.4f}x in {_span(cal.low, cal.high)} ({cal.level:.0%}); recorded before paired statistics "
        f"({CALIBRATION_V1}): shown, not pooled; {RERUN}"
    )
