"""A/A calibrations (`orch calibrate`): this host's spread between triplets for one workload, and finding it.

A calibration is used only on the same host (salted hash and fingerprint: versions, driver and, since issue 52, CPU
model, kernel and GPU UUIDs) for the same protocol id, or for a protocol with the same baseline workload
(protocol.schema.baseline_workload_id: a candidate and its null share one), and only while it is younger than the
protocol's measurement.calibration_max_age_days at the run's start; never another. Every such calibration is pooled
(never just the newest, so that calibrating again cannot shrink the interval). One recorded before paired statistics
(orch.calibration/1) is shown, never pooled.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ledger.cost.record import LedgerRecord
from ledger.verdict.decide.stats import Position, Spread, StepProfile

CALIBRATION_SCHEMA = "orch.calibration/2"
CALIBRATION_V1 = "orch.calibration/1"
CALIBRATION_FILE = "calibration.json"
# fingerprint keys that must be equal for a calibration to speak for this host (versions change the noise too); the
# last three are recorded since issue 52 (a fingerprint without them matches only one without them)
FINGERPRINT_KEYS = ("host_hash", "gpu_model", "gpu_count", "driver", "cuda", "torch", "triton", "python",
                    "cpu_model", "kernel", "gpu_uuids")
DEFAULT_MAX_AGE_DAYS = 7.0  # protocol measurement.calibration_max_age_days
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
    # launch (noise.py); None: recorded before issue 34 (the candidate's noise is then not checked)
    step_sd: float | None = Field(None, ge=0)
    step_df: int = Field(0, ge=0)
    # the baseline's mean log time of each measured step (profile_steps) over every arm of every A/A launch: what a
    # candidate's step-to-step effect is fitted against (noise.StepProfile); None: recorded before it
    profile_steps: list[int] | None = None
    step_profile: list[float] | None = None
    mean_log_speedup: float  # the A/A mean of d: near 0 unless the position in the triplet matters
    # issue 52: each A/A launch's u = mean over windows of log(A_w / B_w) (order A C B) and its launch-position
    # levels (mean log window time at positions 0, 1, 2, less their mean); None: recorded before
    ab_log_ratios: list[float] | None = None
    position_levels: list[list[float]] | None = None
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

    @model_validator(mode="after")
    def _profile_matches_its_steps(self) -> Calibration:
        if (self.profile_steps is None) != (self.step_profile is None) or (
                self.step_profile is not None and len(self.step_profile) != len(self.profile_steps or ())):
            raise ValueError("step_profile and profile_steps must be given together, one value per step")
        return self


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
    """The keys that must match, as strings; a key not recorded (None: a run or calibration from before it) is left
    out, so records made before issue 52 still match each other and never match one that records it."""
    return {k: str(host[k]) for k in FINGERPRINT_KEYS if host.get(k) is not None}


def read_calibration(data: bytes) -> Calibration | CalibrationV1:
    """Either schema; ValueError (pydantic's ValidationError included) when it is neither."""
    schema = json.loads(data).get("schema")
    if schema == CALIBRATION_V1:
        return CalibrationV1.model_validate_json(data)
    return Calibration.model_validate_json(data)


def block_position(block: Mapping[str, Any]) -> Position | None:
    """The launch positions' effect a calibration block measured (issue 52): its A/A mean d over its launches, and
    the mean u of those that record u (0 where none does); None for a block recorded before issue 52."""
    pos = block.get("position")
    if not isinstance(pos, Mapping):
        return None
    return Position(float(pos["mean_log_speedup"]), float(pos["mean_ab_log_ratio"]), int(pos["launches"]))


def calibration_spreads(block: Mapping[str, Any] | None) -> tuple[Spread | None, Spread | None]:
    """(between-triplet, within-triplet window) spreads of an audit's calibration block; None where not usable. The
    between-triplet one carries the block's position effect (issue 52)."""
    if not block or not block.get("usable"):
        return None, None
    ws = block.get("window_sd")
    window = Spread(float(ws), int(block["window_df"])) if ws is not None and block.get("window_df") else None
    return Spread(float(block["sd"]), int(block["df"]), block_position(block)), window


def calibration_step_spread(block: Mapping[str, Any] | None) -> Spread | None:
    """The baseline's within-launch step spread of an audit's calibration block; None when not usable or recorded
    before issue 34 (then the calibration is pooled unscaled, as it was)."""
    if not block or not block.get("usable") or block.get("step_sd") is None or not block.get("step_df"):
        return None
    return Spread(float(block["step_sd"]), int(block["step_df"]))


def calibration_step_profile(block: Mapping[str, Any] | None) -> StepProfile | None:
    """The baseline's step profile of an audit's calibration block; None when not usable or recorded before it (the
    candidate's steps are then taken about their mean, as before)."""
    if not block or not block.get("usable") or not block.get("step_profile") or not block.get("profile_steps"):
        return None
    return StepProfile(tuple(int(i) for i in block["profile_steps"]), tuple(float(x) for x in block["step_profile"]))


def _utc(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else None


def age_days(recorded_at: str, reference: str | None) -> float | None:
    """Days from a calibration's recording to `reference` (the run's first ledger record); None when unknown."""
    a, b = _utc(recorded_at), _utc(reference)
    return None if a is None or b is None else (b - a).total_seconds() / 86400.0


def find_calibration(
    runs_dir: Path, records: Sequence[LedgerRecord], protocol_id: str, host: Mapping[str, Any], before_seq: int | None,
    workload_id: str | None = None, max_age_days: float = DEFAULT_MAX_AGE_DAYS, reference: str | None = None,
) -> dict[str, Any]:
    """Every calibration of this protocol id, or of this baseline workload, on this host recorded before
    `before_seq` and at most `max_age_days` before it, pooled, as an audit block.

    Only ledger records count (kind calibration, this host hash, this protocol id or a calibration file naming
    `workload_id`); the file must hash to the record's digest and its fingerprint must equal this run's. A
    calibration of another host or baseline, or an older one, is never used; the block says why none is shown.
    `usable`: orch.calibration/2 records whose spreads the audit pools (issue 52: all of them, never the newest
    alone, so that calibrating again cannot choose a smaller spread). `reference`: the time ages are counted to
    (default: the start of the record `before_seq`, the run's first).
    """
    wanted = fingerprint(host)
    if reference is None:
        reference = next((r.started for r in records if before_seq is not None and r.seq == before_seq), None)
    stale: list[str] = []
    found: list[tuple[LedgerRecord, Calibration, float | None]] = []
    v1: dict[str, Any] | None = None
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
            changed = sorted(k for k in set(wanted) | set(fingerprint(cal.host))
                             if wanted.get(k) != fingerprint(cal.host).get(k))
            stale.append(f"run {rec.run_id}: host fingerprint differs ({', '.join(changed)})")
            continue
        if isinstance(cal, CalibrationV1):
            if v1 is None:
                v1 = {"found": True, "usable": False, "schema": CALIBRATION_V1, "run_id": cal.run_id, "seq": rec.seq,
                      **_summary_v1(cal), "words": _words_v1(cal)}
            continue
        age = age_days(cal.recorded_at, reference)
        if age is not None and age > max_age_days:
            stale.append(f"run {rec.run_id}: recorded {age:.1f} days before this run, more than "
                         f"measurement.calibration_max_age_days ({max_age_days:g})")
            continue
        found.append((rec, cal, age))
    if found:
        return _pooled_block(found, protocol_id, max_age_days)
    if v1 is not None:
        return v1
    why = "; ".join(stale) if stale else "none recorded for this protocol on this host before this run"
    return {"found": False, "usable": False, "stale": bool(stale),
            "expired": any("calibration_max_age_days" in s for s in stale),
            "words": f"no usable A/A calibration ({why}); run `orch calibrate PROTOCOL` to measure this host"}


def _pooled(pairs: Sequence[tuple[float | None, int]]) -> tuple[float | None, int]:
    got = [(sd, df) for sd, df in pairs if sd is not None and df > 0]
    df = sum(d for _, d in got)
    return (math.sqrt(math.fsum(d * sd**2 for sd, d in got) / df), df) if df else (None, 0)


def _pooled_block(found: Sequence[tuple[LedgerRecord, Calibration, float | None]], protocol_id: str,
                  max_age_days: float) -> dict[str, Any]:
    """The audit block of the calibrations found (newest first): between-launch, window and step spreads pooled (df
    added), the A/A means over every launch (the launch positions' effect, issue 52), and what was pooled."""
    rec, newest, _ = found[0]
    cals = [c for _, c, _ in found]
    sd, df = _pooled([(c.sd, c.df) for c in cals])
    window_sd, window_df = _pooled([(c.window_sd, c.window_df) for c in cals])
    step_sd, step_df = _pooled([(c.step_sd, c.step_df) for c in cals])
    profile = _pooled_profile(cals)
    d = [x for c in cals for x in c.log_speedups]
    us = [x for c in cals for x in (c.ab_log_ratios or [])]
    mean_d = math.fsum(d) / len(d)
    mean_u = math.fsum(us) / len(us) if us else 0.0
    ages = [a for _, _, a in found if a is not None]
    shared = "" if newest.of_protocol_id == protocol_id else (
        f"; calibrated on protocol {newest.of_protocol_name} ({newest.of_protocol_id[:12]}), whose baseline workload "
        "is this run's")
    summary = _summary(newest) | {
        "run_ids": [r for c in cals for r in (c.run_ids or [c.run_id])] if len(cals) > 1 else newest.run_ids,
        "repeats": len(d), "headlines": [h for c in cals for h in c.headlines], "log_speedups": d,
        "sd": sd, "df": df, "window_sd": window_sd, "window_df": window_df, "mean_log_speedup": mean_d,
        **({"step_sd": step_sd, "step_df": step_df} if step_sd is not None else {}),
        **({"profile_steps": list(profile.steps), "step_profile": list(profile.log_times)} if profile else {}),
    }
    what = (f"{len(cals)} A/A calibrations of this workload on this host pooled ({len(d)} launches; between-launch "
            f"SD {sd:.4f} of the paired log speedup, df {df}); newest: " if len(cals) > 1 else "")
    age_words = ("" if not ages else f"; age {max(ages):.2f} days (at most {max_age_days:g}: "
                 "measurement.calibration_max_age_days)")
    position = (f"; launch positions: A/A mean speedup {math.exp(mean_d):.4f}x over {len(d)} launches, subtracted "
                f"from the run's paired log speedup (its variance carried); A/A mean A/B {math.exp(mean_u):.4f}x"
                + (f" over {len(us)} launches" if us else " (u not recorded)"))
    return {"found": True, "usable": True, "schema": CALIBRATION_SCHEMA, "run_id": newest.run_id, "seq": rec.seq,
            "of_protocol_id": newest.of_protocol_id, "of_protocol_name": newest.of_protocol_name, **summary,
            "pooled": len(cals), "age_days": max(ages) if ages else None, "max_age_days": max_age_days,
            "calibrations": [{"run_id": c.run_id, "recorded_at": c.recorded_at, "age_days": a, "launches": c.repeats,
                              "sd": c.sd, "df": c.df} for _, c, a in found],
            "position": {"mean_log_speedup": mean_d, "mean_ab_log_ratio": mean_u, "launches": len(d),
                         "ab_launches": len(us)},
            "words": what + calibration_words(newest) + shared + age_words + position}


def _pooled_profile(cals: Sequence[Calibration]) -> StepProfile | None:
    """The step profiles of the pooled calibrations (newest first) that record one for the same steps as the newest
    that records one, averaged with their launches as weights; None when none records one."""
    steps = next((c.profile_steps for c in cals if c.profile_steps is not None), None)
    got = [c for c in cals if c.profile_steps == steps and c.step_profile is not None]
    if steps is None or not got:
        return None
    n = sum(c.repeats for c in got)
    return StepProfile(tuple(steps), tuple(math.fsum(c.repeats * (c.step_profile or [])[i] for c in got) / n
                                           for i in range(len(steps))))


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
        **({"profile_steps": cal.profile_steps, "step_profile": cal.step_profile} if cal.step_profile else {}),
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
    if cal.profile_steps:
        window += (f" and step profile over steps {cal.profile_steps[0]}-{cal.profile_steps[-1]} (the candidate's "
                   "steps are taken about a line in it)")
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
