"""The verdict of a run (ours, DESIGN.md section 5): the owner's headline per triplet, beside the paired interval.

accepted (exact, bounded, the interval excludes 1, no busy window, no outlier decides), no difference shown, not
exact; exit codes here. The interval: ledger/verdict/decide/stats.py (fixed design) or sequential.py (repeats: auto).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ledger.verdict.decide.noise import (
    NoiseEvidence,
    ab_expected,
    as_noise,
    baseline_disagreement,
    baseline_outliers,
    without_window,
)
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.stats import (
    Interval,
    Outlier,
    Spread,
    outlier_triplets,
    paired_interval,
    triplet_log_speedup,
)
from ledger.verdict.decide.windows import Speedup, speedup
from protocol.plan import Triplet

ACCEPTED, NO_DIFFERENCE, NOT_EXACT = "accepted", "no difference shown", "not exact"
VERDICTS = (ACCEPTED, NO_DIFFERENCE, NOT_EXACT)
HOW_TO_BOUND = (
    "run `orch calibrate PROTOCOL` on this host (A/A launches measure the spread between launches), or set "
    "measurement.repeats >= 2 (or auto)"
)


def exit_code(verdict: str) -> int:
    """The same for `orch launch` and `orch audit`: only `not exact` (or no verdict) is a failure (exit 1)."""
    return 0 if verdict in (ACCEPTED, NO_DIFFERENCE) else 1


def triplet_speedups(
    times: Mapping[str, Sequence[float]], trips: Sequence[Triplet], *, steps: int, warmup: int, window: int,
    drift_bound: float,
) -> list[Speedup]:
    """The owner's speedup (windows, ratios, drift, headline) of each triplet, from its own three launches."""
    return [
        speedup({role: times[label] for role, label in t.labels.items()}, steps=steps, warmup=warmup,
                window=window, drift_bound=drift_bound)
        for t in trips
    ]


def window_ratios(sps: Sequence[Speedup]) -> list[list[float]]:
    """Each triplet's window ratios (the owner's ratio_w), in window order."""
    return [[w.ratio for w in sp.windows] for sp in sps]


def log_speedups(sps: Sequence[Speedup]) -> list[float]:
    """d of each triplet: the mean over its windows of log(ratio_w) (stats.triplet_log_speedup)."""
    return [triplet_log_speedup(r) for r in window_ratios(sps)]


def verdict_interval(d: Sequence[float], calibration: Spread | None, rule: SequentialRule | None,
                     noise: NoiseEvidence | None = None) -> Interval:
    """The interval the verdict reads: the sequential rule's repeated interval at this look, else the fixed one;
    with a calibration that records the baseline's step spread, scaled by the candidate's noise (noise.py)."""
    if rule is not None:
        return rule.interval(d, calibration, noise)
    return paired_interval(d, calibration, noise=None if noise is None else noise.scale(len(d), calibration))


@dataclass(frozen=True)
class OutlierEffect:
    """A flagged triplet and the interval of the same rule without it."""

    outlier: Outlier
    without: Interval


def outlier_effects(d: Sequence[float], flagged: Sequence[Outlier], calibration: Spread | None,
                    rule: SequentialRule | None) -> list[OutlierEffect]:
    return [OutlierEffect(o, verdict_interval([x for i, x in enumerate(d) if i != o.triplet], calibration, rule))
            for o in flagged]


def deciding_outlier(direction: str | None, effects: Sequence[OutlierEffect]) -> OutlierEffect | None:
    """The first outlier triplet a decision (faster | slower; None: none) rests on: the same rule's interval
    without it does not decide the same way. The one test both the audit (decide) and a sequential look
    (sequential_doc.look) apply, so that a launch never stops 'decided' where the audit refuses."""
    if direction is None:
        return None
    return next((e for e in effects if _call(e.without) != direction), None)


def outlier_check(direction: str | None, d: Sequence[float], calibration: Spread | None,
                  rule: SequentialRule | None) -> OutlierEffect | None:
    """The outlier triplets of d (stats.outlier_triplets, with the calibration) and the one a decision rests on, as
    the audit computes them (document.py)."""
    if direction is None:
        return None
    return deciding_outlier(direction, outlier_effects(d, outlier_triplets(d, calibration), calibration, rule))


@dataclass(frozen=True)
class WindowEffect:
    """A window flagged against the calibrated window SD in a one-triplet run, and that triplet's interval without
    it (estimate, low, high)."""

    outlier: Outlier
    without: tuple[float, float, float]


def window_effects(ratios: Sequence[Sequence[float]], flagged: Sequence[Outlier], iv: Interval,
                   calibration: Spread | None, window_sd: Spread | None) -> list[WindowEffect]:
    """At K = 1 with a calibration that records the step spread (iv.noise set): each flagged window's effect. An
    outlier window never decides alone at K = 1 (issue 34); at K >= 2 it stays a diagnostic."""
    if iv.triplets != 1 or calibration is None or window_sd is None or iv.noise is None:
        return []
    noise = as_noise(iv.noise)
    return [WindowEffect(o, without_window(ratios[0], o.window, calibration, window_sd, noise, iv.nominal_level))
            for o in flagged if o.window is not None and len(ratios[0]) >= 2]


@dataclass(frozen=True)
class BaselineEffect:
    """A triplet whose baseline launches A and B disagree beyond the calibrated between-launch spread
    (noise.baseline_outliers), and the same rule's interval without that triplet (None at K = 1: nothing is left)."""

    outlier: Outlier
    disagreement: float  # exp(u): A's window times over B's
    without: Interval | None


def baseline_effects(us: Sequence[float], flagged: Sequence[Outlier], d: Sequence[float],
                     calibration: Spread | None, rule: SequentialRule | None,
                     noise: NoiseEvidence | None) -> list[BaselineEffect]:
    """Each flagged triplet's effect. Applied only with a calibration that records the step spread (as the window
    check), so audits of runs calibrated before issue 34 recompute unchanged. One of A, B is then likely a whole
    launch outlier, which moves d by half its size: such a triplet never decides alone."""
    if calibration is None or noise is None or noise.calibration_step is None:
        return []
    out = []
    for o in flagged:
        keep = [j for j in range(len(d)) if j != o.triplet]
        rest = NoiseEvidence(tuple(a for j, a in enumerate(noise.triplets) if j != o.triplet),
                             noise.calibration_step)
        without = verdict_interval([d[j] for j in keep], calibration, rule, rest) if keep else None
        out.append(BaselineEffect(o, math.exp(us[o.triplet]), without))
    return out


def deciding_baseline(iv: Interval, effects: Sequence[BaselineEffect]) -> BaselineEffect | None:
    """The first flagged A/B triplet the interval's decision rests on (at K = 1 always; at K >= 2 when the same rule's
    interval without it does not decide the same way), or None. The one test both the audit (decide) and a
    sequential look (sequential_doc.look) apply, so that a launch never stops 'decided' where the audit refuses."""
    direction = _call(iv)
    if direction is None:
        return None
    return next((b for b in effects if b.without is None or _call(b.without) != direction), None)


def ab_check(iv: Interval, us: Sequence[float], d: Sequence[float], calibration: Spread | None,
             rule: SequentialRule | None, noise: NoiseEvidence | None) -> BaselineEffect | None:
    """The A/B launch check of the first len(d) triplets (us: each triplet's baseline_disagreement, at least len(d)
    of them): the flagged triplet the decision of iv rests on, or None."""
    k = len(d)
    if len(us) < k:
        raise ValueError(f"the A/B launch check needs each triplet's A/B contrast: {len(us)} for {k} triplets")
    head = list(us[:k])
    return deciding_baseline(iv, baseline_effects(head, baseline_outliers(head, calibration), d, calibration, rule,
                                                  noise))


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4f}"


def _call(iv: Interval) -> str | None:
    """faster | slower | None (unbounded or covers 1): what the interval alone decides."""
    if not iv.bounded or iv.covers_one:
        return None
    return "faster" if iv.low > 1.0 else "slower"


def decide(exact: bool, iv: Interval, busy: Sequence[str] = (), outliers: Sequence[OutlierEffect] = (),
           triplet_names: Sequence[str] | None = None, stopping: str | None = None,
           windows: Sequence[WindowEffect] = (), window_names: Sequence[str] | None = None,
           baselines: Sequence[BaselineEffect] = (), unprimed: Sequence[str] = (),
           ) -> tuple[str, str | None, str]:
    """(verdict, direction, one sentence). triplet_names: how the sentence names triplet i (default its 1-based
    position); stopping: why a sequential run did not stop where its rule stops (its error rate is then not held);
    windows: outlier windows of a one-triplet run, which never decide alone; baselines: triplets whose A/B launches
    disagree beyond the calibration, which never decide alone (at K = 1 the run is not decided); unprimed: baseline
    launches that compiled or tuned what a shortened prime (measurement.prime_steps) did not reach."""
    span = f"{iv.level:.0%} interval [{_fmt(iv.low)}, {_fmt(iv.high)}]"
    if not exact:
        return NOT_EXACT, None, "the candidate does not compute the same bits; its speed is not judged"
    if not iv.bounded:
        return NO_DIFFERENCE, None, (
            f"the speedup cannot be bounded yet: {iv.triplets} triplet and no usable A/A calibration of this protocol "
            f"on this host; {HOW_TO_BOUND}")
    direction = _call(iv)
    if direction is None:
        return NO_DIFFERENCE, None, f"the {span} of the speedup covers 1: no speed difference is shown"
    if iv.variance_source == "run" and iv.check is None:  # no calibration at all (check: run's SD against one)
        return NO_DIFFERENCE, None, (
            f"the {span} excludes 1, but no usable A/A calibration of this protocol on this host: C is always the "
            "middle launch, so without one a launch-position effect cannot be told apart from a speed difference "
            "(docs/validation/VERDICT.md, issue 52); run `orch calibrate`, then audit again")
    if busy:
        return NO_DIFFERENCE, None, (
            f"the {span} excludes 1, but the host watch names busy window(s): {'; '.join(busy)}; not accepted "
            "from a busy host: re-run when it is quiet")
    if stopping:
        return NO_DIFFERENCE, None, f"the {span} excludes 1, but {stopping}"
    if unprimed:
        return NO_DIFFERENCE, None, (
            f"the {span} excludes 1, but {'; '.join(unprimed)}: their steps may hold compile time; raise "
            "measurement.prime_steps, or remove it so that the prime runs every step")
    eff = deciding_outlier(direction, outliers)
    if eff is not None:
        i = eff.outlier.triplet
        name = triplet_names[i] if triplet_names is not None else str(i + 1)
        return NO_DIFFERENCE, None, (
            f"the {span} excludes 1 only with triplet {name}, an outlier (z = {eff.outlier.z:.2f}): without it "
            f"the interval is [{_fmt(eff.without.low)}, {_fmt(eff.without.high)}]; one triplet does not decide")
    b = deciding_baseline(iv, baselines)
    if b is not None:
        i = b.outlier.triplet
        name = triplet_names[i] if triplet_names is not None else str(i + 1)
        what = (f"the baseline launches A and B of triplet {name} disagree beyond the calibrated between-launch "
                f"spread (A/B = {b.disagreement:.4f}, z = {b.outlier.z:.2f}, p = {b.outlier.p_value:.2g}): one "
                "of them is likely a whole-launch outlier, which moves the speedup by half its size")
        if b.without is None:
            return NO_DIFFERENCE, None, (
                f"the {span} excludes 1, but {what}; one triplet has nothing to decide without it: re-run, or "
                "set measurement.repeats >= 2")
        return NO_DIFFERENCE, None, (
            f"the {span} excludes 1, but {what}; without that triplet the interval is "
            f"[{_fmt(b.without.low)}, {_fmt(b.without.high)}]; one triplet does not decide")
    for w in windows:
        est, low, high = w.without
        if not (low > 1.0 if direction == "faster" else high < 1.0):
            j = w.outlier.window if w.outlier.window is not None else 0
            name = window_names[j] if window_names is not None and j < len(window_names) else str(j + 1)
            return NO_DIFFERENCE, None, (
                f"the {span} excludes 1 only with window {name}, an outlier against the calibrated window SD "
                f"(z = {w.outlier.z:.2f}): without it the speedup is {est:.4f}x in [{_fmt(low)}, {_fmt(high)}]; one "
                "window does not decide at K = 1")
    return ACCEPTED, direction, f"the candidate is {direction}: the {span} of the speedup excludes 1"


def replication_doc(trips: Sequence[Triplet], sps: Sequence[Speedup]) -> dict[str, object]:
    """The owner's headline of each triplet, untouched, beside its paired speedup exp(d)."""
    ds = log_speedups(sps)
    return {
        "repeats": len(trips),
        "triplets": [
            {
                "index": t.index,
                "order": list(t.order),
                "labels": t.labels,
                "headline": sp.headline,
                "headline_window": sp.headline_window,
                "ratios": [w.ratio for w in sp.windows],
                "drifts": [w.drift for w in sp.windows],
                "max_drift": sp.max_drift,
                "log_speedup": d,
                "paired_speedup": math.exp(d),
            }
            for t, sp, d in zip(trips, sps, ds, strict=True)
        ],
        "headlines": [sp.headline for sp in sps],
        "paired_speedups": [math.exp(d) for d in ds],
    }


def position_levels(t: Triplet, sp: Speedup) -> list[float]:
    """The level of each launch position (0, 1, 2) of one triplet: the mean over the owner's windows of the log of
    the window time of the launch at that position, less the three's mean (issue 52: position effects are checked
    from the files)."""
    by_role = {role: math.fsum(math.log(getattr(w, role.lower())) for w in sp.windows) / len(sp.windows)
               for role in ("A", "C", "B")}
    at = {t.order.index(label): by_role[role] for role, label in t.labels.items()}
    levels = [at[i] for i in range(3)]
    mean = math.fsum(levels) / 3.0
    return [x - mean for x in levels]


def positions_doc(trips: Sequence[Triplet], sps: Sequence[Speedup], calibration: Spread | None) -> dict[str, object]:
    """Each triplet's A/B log ratio u and launch-position levels, and the position effect the calibration subtracts
    (issue 52): what position effects can be checked from."""
    pos = calibration.position if calibration is not None else None
    return {
        "triplets": [{"index": t.index, "order": list(t.order), "ab_log_ratio": baseline_disagreement(sp),
                      "expected_ab_log_ratio": 0.0 if calibration is None else ab_expected(i, calibration),
                      "levels": position_levels(t, sp)}
                     for i, (t, sp) in enumerate(zip(trips, sps, strict=True))],
        "calibration": None if pos is None else {"mean_log_speedup": pos.d, "mean_ab_log_ratio": pos.u,
                                                 "launches": pos.launches},
        "words": ("no calibration: the run's d is not corrected for launch positions" if pos is None else
                  f"the calibration's A/A mean speedup {math.exp(pos.d):.4f}x over {pos.launches} launches (the "
                  "launch positions' effect on d) is subtracted from each triplet's d, its variance carried; the A/B "
                  f"launch check centres u on the A/A mean A/B {math.exp(pos.u):.4f}x of its order"),
    }


def drift_notes(trips: Sequence[Triplet], sps: Sequence[Speedup], bound: float) -> list[str]:
    """A drift above the protocol's bound is named: a diagnostic of the launches, not the verdict."""
    out = []
    for t, sp in zip(trips, sps, strict=True):
        worst = max(sp.windows, key=lambda w: w.drift)
        if worst.drift > bound:
            where = f"triplet {t.index} " if len(trips) > 1 else ""
            out.append(
                f"drift above the protocol's bound: {where}window {worst.name} A/B drift {worst.drift:.4f} > "
                f"{bound} (the two baseline launches disagree; the paired ratio uses their mean, and drift that "
                "differs between triplets widens the interval)"
            )
    return out


def outlier_notes(trips: Sequence[Triplet], triplets: Sequence[Outlier], windows: Sequence[Outlier],
                  window_names: Sequence[str]) -> list[str]:
    """Outlier triplets and windows, named (diagnostics; a deciding outlier triplet is in the verdict itself)."""
    out = [f"outlier triplet {trips[o.triplet].index}: its paired log speedup stands apart from the others "
           f"(z = {o.z:.2f}, df {o.df}, p = {o.p_value:.2g} before the Bonferroni correction)" for o in triplets]
    for o in windows:
        where = f"triplet {trips[o.triplet].index} " if len(trips) > 1 else ""
        name = window_names[o.window] if o.window is not None and o.window < len(window_names) else str(o.window)
        out.append(f"outlier window: {where}window {name} stands apart from its triplet's other windows "
                   f"(z = {o.z:.2f}, df {o.df}, p = {o.p_value:.2g} before the Bonferroni correction)")
    return out
