"""The sequential stop of one run, shared by the launch (each look) and the audit (its "sequential" block): which rule
a run is under, the looks replayed from the recorded triplets, and whether the run stopped where its rule stops.

Pure: inputs are the protocol's measurement, run.json's `sequential` section, the per-triplet d, the calibration's
spread and the ledger's GPU-seconds per package.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ledger.verdict.decide.calibration import block_position
from ledger.verdict.decide.decision import BaselineEffect, OutlierEffect, ab_check, outlier_check
from ledger.verdict.decide.noise import NoiseEvidence
from ledger.verdict.decide.sequential import METHOD, SequentialRule
from ledger.verdict.decide.stats import LEVEL, Interval, Spread
from protocol.plan import DEFAULT_TARGET_HALF_WIDTH, triplets, triplets_in
from protocol.run_record import RunRecord
from protocol.schema import Measurement
from protocol.sequential_run import SequentialLook, SequentialRecord, StopReason

GUARANTEE = (
    "the repeated intervals of all looks cover the true speedup together with probability >= the level (exactly so "
    "for normal per-triplet log speedups of known variance; Student t multipliers at each look's df), so accepting "
    "at whatever look the data decide errs with probability <= 1 - level"
)


def rule_of(measurement: Measurement) -> SequentialRule | None:
    """The protocol's own sequential rule (measurement.repeats: auto), None for a fixed number of triplets."""
    if not measurement.sequential:
        return None
    return SequentialRule(max_triplets=measurement.max_repeats, level=LEVEL,
                          target_half_width=measurement.target_half_width)


def asked_record(measurement: Measurement, until_decided: int | None) -> SequentialRecord | None:
    """run.json's `sequential` section at the start of a run: the protocol's rule, or the one `orch launch
    --until-decided --max-repeats N` asked for on a protocol with a fixed number of triplets; None for neither."""
    rule = rule_of(measurement)
    if rule is not None:
        return SequentialRecord(asked="protocol", max_triplets=rule.max_triplets,
                                target_half_width=rule.target_half_width, level=rule.level)
    if until_decided is None:
        return None
    return SequentialRecord(asked="--until-decided", max_triplets=until_decided,
                            target_half_width=DEFAULT_TARGET_HALF_WIDTH, level=LEVEL)


def run_rule(measurement: Measurement, record: SequentialRecord | None) -> SequentialRule | None:
    """The rule a run was under: the protocol's (repeats: auto), else the one run.json says --until-decided asked."""
    rule = rule_of(measurement)
    if rule is not None or record is None:
        return rule
    return SequentialRule(max_triplets=record.max_triplets, level=record.level,
                          target_half_width=record.target_half_width)


def triplets_taken(measurement: Measurement, run: RunRecord | None, names: Iterable[str]) -> tuple[int, bool]:
    """(triplets, sequential) of a recorded run: a fixed design's repeats, or for a sequential run the triplets its
    ledger records reach (names: the packages of the run's ledger records; the ledger is authoritative)."""
    if not (measurement.sequential or (run is not None and run.sequential is not None)):
        return measurement.fixed_repeats or 1, False
    return max(1, triplets_in(names)), True


def calibration_spread(block: Mapping[str, Any] | None) -> Spread | None:
    """The between-triplet SD of d (and its df) of the A/A calibration block that find_calibration returns; None
    when none was found or it is not usable (an orch.calibration/1 records no spread of d)."""
    if not block or not block.get("usable"):
        return None
    sd, df = block.get("sd"), block.get("df")
    if not isinstance(sd, int | float) or not isinstance(df, int) or df < 1 or not math.isfinite(sd) or sd < 0:
        return None
    return Spread(float(sd), df, block_position(block))


@dataclass(frozen=True)
class Look:
    triplets: int
    interval: Interval
    stop: str | None  # decided | precise | maximum | None (add a triplet)
    held: BaselineEffect | None = None  # the interval excludes 1 only with this flagged A/B triplet: not decided
    outlier: OutlierEffect | None = None  # ... only with this outlier triplet (stats.outlier_triplets): not decided

    @property
    def record(self) -> SequentialLook:
        iv = self.interval
        return SequentialLook(
            triplets=self.triplets, estimate=iv.estimate, low=iv.low if iv.bounded else None,
            high=iv.high if iv.bounded else None, nominal_level=iv.nominal_level, df=int(iv.df),
            variance_source=iv.variance_source, stop=cast(StopReason | None, self.stop))

    def _rests(self) -> str | None:
        """Why a look whose interval excludes 1 is not decided: the triplet its decision rests on (None: none)."""
        if self.outlier is not None:
            o, w = self.outlier.outlier, self.outlier.without
            return (f"excludes 1 only with triplet {o.triplet + 1}, an outlier (z = {o.z:.2f}; without it "
                    f"[{w.low:.4f}, {w.high:.4f}]), and the decision rests on it")
        if self.held is not None:
            h = self.held
            return (f"excludes 1, but the baseline launches A and B of triplet {h.outlier.triplet + 1} disagree "
                    f"beyond the calibrated between-launch spread (A/B = {h.disagreement:.4f}, z = {h.outlier.z:.2f})"
                    " and the decision rests on it")
        return None

    def words(self, max_triplets: int) -> str:
        iv = self.interval
        head = f"look {self.triplets}: speedup {iv.estimate:.4f}x"
        if not iv.bounded:
            span = "unbounded (no spread yet)"
        else:
            span = (f"{iv.level:.0%} repeated interval [{iv.low:.4f}, {iv.high:.4f}] (nominal {iv.nominal_level:.2%} "
                    f"at this look, df {iv.df:.4g}, {iv.variance_source} spread, half-width {iv.half_width:.1%})")
        rests = self._rests()
        if rests is not None:
            why = (f"{rests}: stop at the maximum of {max_triplets} triplets, not decided" if self.stop == "maximum"
                   else f"{rests}: not decided, add triplet {self.triplets + 1} of at most {max_triplets}")
        elif self.stop == "decided":
            why = f"excludes 1: stop, decided {'faster' if iv.low > 1.0 else 'slower'}"
        elif self.stop == "precise":
            why = "covers 1 and is precise enough: stop, no difference shown at this precision"
        elif self.stop == "maximum":
            why = f"covers 1 at the maximum of {max_triplets} triplets: stop"
        else:
            why = f"covers 1 and is not yet precise: add triplet {self.triplets + 1} of at most {max_triplets}"
        return f"{head}, {span}; {why}"


def look(rule: SequentialRule, d: Sequence[float], calibration: Spread | None,
         noise: NoiseEvidence | None = None, ab: Sequence[float] | None = None) -> Look | None:
    """The look after len(d) triplets, or None before the rule's first look. ab: each triplet's A/B contrast
    (noise.baseline_disagreement), for the A/B launch check, which applies with a calibration that records the step
    spread (noise.calibration_step; decision.baseline_effects): an interval that excludes 1 only with a flagged
    triplet (decision.deciding_baseline, the audit's own test) does not stop as decided; the rule adds a triplet, and
    at the maximum stops there ('maximum': the audit will say not decided). The same holds for an interval that
    excludes 1 only with an outlier triplet (decision.outlier_check, the audit's own test), with or without a
    calibration."""
    k = len(d)
    if k < rule.first_look(calibration):
        return None
    iv = rule.interval(d, calibration, noise)
    stop = rule.stop(iv)
    if stop != "decided":
        return Look(k, iv, stop)
    out = outlier_check("faster" if iv.low > 1.0 else "slower", d, calibration, rule)
    if out is not None:
        return Look(k, iv, "maximum" if k >= rule.max_triplets else None, outlier=out)
    if calibration is None or noise is None or noise.calibration_step is None:
        return Look(k, iv, stop)
    if ab is None:
        raise ValueError("a look with a calibration that records the step spread needs each triplet's A/B contrast")
    held = ab_check(iv, ab, d, calibration, rule, noise)
    if held is None:
        return Look(k, iv, stop)
    return Look(k, iv, "maximum" if k >= rule.max_triplets else None, held)


def replay(rule: SequentialRule, d: Sequence[float], calibration: Spread | None,
           noise: NoiseEvidence | None = None, ab: Sequence[float] | None = None) -> list[Look]:
    """The looks the rule takes over the recorded d in order, up to the first that stops (or the last triplet)."""
    looks: list[Look] = []
    for k in range(1, len(d) + 1):
        one = look(rule, d[:k], calibration, noise, ab)
        if one is not None:
            looks.append(one)
            if one.stop is not None:
                break
    return looks


def integrity(rule: SequentialRule, taken: int, looks: Sequence[Look], first_look: int) -> tuple[bool, str]:
    """Did the run take exactly the triplets its rule takes? (a run that stopped early or went on is named)"""
    stopped = next((lk for lk in looks if lk.stop is not None), None)
    if stopped is None:
        before = (f"before the rule's first look (after triplet {first_look})" if not looks
                  else f"at look {taken}, where its rule says to add a triplet")
        return False, (f"the run stopped after {taken} triplet(s), {before}: it stopped earlier than its rule "
                       f"(at most {rule.max_triplets}); its interval does not carry the rule's error rate, so it "
                       "cannot be accepted")
    if stopped.triplets < taken:
        return False, (f"the rule stops after triplet {stopped.triplets} ({stopped.stop}) but the run took {taken}: "
                       "it went on after its rule stopped (triplets added until a wished-for result shows break the "
                       "error rate), so it cannot be accepted")
    return True, f"the run took {taken} triplet(s), exactly where its rule stops ({stopped.stop})"


def _per_triplet(by_package: Mapping[str, float], taken: int) -> list[float]:
    """The sum over each triplet's train and reload packages."""
    return [math.fsum(by_package.get(f"{kind}-{label}", 0.0) for label in t.order for kind in ("train", "reload"))
            for t in (triplets(taken, sequential=True) if taken else [])]


def _iv_doc(iv: Interval) -> dict[str, Any]:
    return {
        "estimate": iv.estimate, "low": iv.low if iv.bounded else None, "high": iv.high if iv.bounded else None,
        "level": iv.level, "nominal_level": iv.nominal_level, "df": iv.df, "sd": iv.sd,
        "variance_source": iv.variance_source, "covers_one": iv.covers_one,
        "half_width": iv.half_width if math.isfinite(iv.half_width) else None,
    }


def sequential_doc(
    rule: SequentialRule, asked: str, d: Sequence[float], calibration: Spread | None,
    gpu_seconds: Mapping[str, float], recorded: SequentialRecord | None = None,
    wall_s: Mapping[str, float] | None = None, noise: NoiseEvidence | None = None,
    ab: Sequence[float] | None = None,
) -> dict[str, Any]:
    """The audit's "sequential" block: the rule in words, each look replayed from the triplets' d (in launch order),
    the triplets taken, why the run stopped, the GPU-seconds of the decision, and the integrity check
    (`integrity.ok` False: the run stopped earlier or later than its rule, or run.json's looks differ from the
    replay; the audit must not accept it). gpu_seconds, wall_s: package name -> GPU-seconds, seconds (the ledger's
    close records; a CPU protocol's GPU-seconds are 0, its wall seconds say what the decision took)."""
    taken = len(d)
    looks = replay(rule, d, calibration, noise, ab)
    ok, words = integrity(rule, taken, looks, rule.first_look(calibration))
    problems = [] if ok else [words]
    if recorded is not None:
        settings = (recorded.max_triplets, recorded.target_half_width, recorded.level)
        if settings != (rule.max_triplets, rule.target_half_width, rule.level):
            problems.append(f"run.json's rule (at most {recorded.max_triplets} triplets, half-width "
                            f"{recorded.target_half_width}, level {recorded.level}) is not the protocol's "
                            f"({rule.max_triplets}, {rule.target_half_width}, {rule.level})")
        said = [(lk.triplets, lk.stop) for lk in recorded.looks]
        again = [(lk.triplets, lk.stop) for lk in looks]
        if said != again:
            problems.append(f"run.json's looks {said} differ from the replay of the recorded triplets {again}")
        if recorded.triplets is not None and recorded.triplets != taken:
            problems.append(f"run.json says {recorded.triplets} triplet(s) were taken, the evidence holds {taken}")
    per_triplet = _per_triplet(gpu_seconds, taken)
    wall = _per_triplet(wall_s or {}, taken)
    stopped = looks[-1] if looks and looks[-1].stop is not None else None
    return {
        "method": METHOD,
        "guarantee": GUARANTEE,
        "rule": rule.words,
        "asked": asked,
        "level": rule.level,
        "max_triplets": rule.max_triplets,
        "target_half_width": rule.target_half_width,
        "first_look": rule.first_look(calibration),
        "calibration": None if calibration is None else {"sd": calibration.sd, "df": calibration.df},
        "log_speedups": list(d),
        "looks": [{"triplets": lk.triplets, **_iv_doc(lk.interval), "stop": lk.stop,
                   "gpu_seconds": math.fsum(per_triplet[: lk.triplets]),
                   "words": lk.words(rule.max_triplets)} for lk in looks],
        "triplets": taken,
        "rule_triplets": None if stopped is None else stopped.triplets,
        "stop": None if stopped is None else stopped.stop,
        "interval": None if not looks else _iv_doc(looks[-1].interval),
        "gpu_seconds": {
            "per_triplet": per_triplet,
            "decision": math.fsum(per_triplet),
            "run": math.fsum(gpu_seconds.values()),
        },
        "wall_s": {"per_triplet": wall, "decision": math.fsum(wall), "run": math.fsum((wall_s or {}).values())},
        "integrity": {"ok": not problems, "problems": problems, "words": words if not problems
                      else "; ".join(problems)},
        "words": (f"{rule.words}. Took {taken} triplet(s), "
                  + (f"stopped: {stopped.stop}" if stopped is not None else "without a stopping look")
                  + f"; the decision cost {math.fsum(per_triplet):.1f} GPU-seconds of triplets. "
                  + ("Integrity: " + words if not problems else "NOT ACCEPTABLE: " + "; ".join(problems))),
    }
