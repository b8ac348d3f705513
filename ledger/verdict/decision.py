"""The verdict of a run (ours, DESIGN.md section 5): the owner's headline per triplet, bracketed by an interval.

accepted (exact, the interval excludes 1), no difference shown (exact, it covers 1), not exact; exit codes here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.verdict.legacy_stats import Interval, speedup_interval
from ledger.verdict.windows import Speedup, speedup, window_steps
from protocol.plan import Triplet, arm_of

ACCEPTED, NO_DIFFERENCE, NOT_EXACT = "accepted", "no difference shown", "not exact"
VERDICTS = (ACCEPTED, NO_DIFFERENCE, NOT_EXACT)


def exit_code(verdict: str) -> int:
    """The same for `orch launch` and `orch audit`: only `not exact` (or no verdict) is a failure (exit 1)."""
    return 0 if verdict in (ACCEPTED, NO_DIFFERENCE) else 1


def launch_windows(
    times: Mapping[str, Sequence[float]], *, steps: int, warmup: int, window: int
) -> dict[str, list[float]]:
    """Launch label -> its window times (sum of the window's step times, max over ranks: the owner's A_w)."""
    ws = window_steps(steps, warmup, window)
    return {label: [math.fsum(t[s] for s in w) for w in ws] for label, t in times.items()}


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


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4f}"


def interval_doc(iv: Interval, repeats: int) -> dict[str, Any]:
    words = (
        f"speedup {_fmt(iv.estimate)}x, {iv.level:.0%} interval [{_fmt(iv.low)}, {_fmt(iv.high)}] "
        f"({iv.baseline_launches} baseline and {iv.candidate_launches} candidate launches, df {iv.df})"
    )
    if iv.df == 0:
        width = "no launch-level spread can be estimated from one launch per arm: the interval is unbounded"
    elif repeats == 1:
        width = (
            f"one triplet: the interval rests on the spread of the two baseline launches alone (df {iv.df}), so it "
            f"is wide (half-width {iv.half_width:.1%}); set measurement.repeats to narrow it"
        )
    else:
        width = f"half-width {iv.half_width:.1%} from {repeats} triplets"
    if iv.triplets_for_target is None:
        need = "a +-5% interval is out of reach on this host at this launch-to-launch spread"
    else:
        need = f"about {iv.triplets_for_target} triplet(s) would give a +-5% interval on this host"
    return {
        "estimate": iv.estimate,
        "low": iv.low if math.isfinite(iv.low) else None,
        "high": iv.high if math.isfinite(iv.high) else None,
        "level": iv.level,
        "method": iv.method,
        "df": iv.df,
        "baseline_launches": iv.baseline_launches,
        "candidate_launches": iv.candidate_launches,
        "covers_one": iv.covers_one,
        "half_width": iv.half_width if math.isfinite(iv.half_width) else None,
        "variance": {
            "launch_sd": iv.launch_sd,
            "launch_level_sd": iv.launch_level_sd,
            "window_level_sd": iv.window_level_sd,
            "scale": "natural log of window time",
        },
        "triplets_for_5pct": iv.triplets_for_target,
        "words": f"{words}; {width}; {need}",
    }


def replication_doc(trips: Sequence[Triplet], sps: Sequence[Speedup]) -> dict[str, Any]:
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
            }
            for t, sp in zip(trips, sps, strict=True)
        ],
        "headlines": [sp.headline for sp in sps],
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
                f"{bound} (the two baseline launches disagree; it enters the interval as launch-level variance)"
            )
    return out


def decide(exact: bool, iv: Interval) -> tuple[str, str | None, str]:
    """(verdict, direction, one sentence)."""
    span = f"{iv.level:.0%} interval [{_fmt(iv.low)}, {_fmt(iv.high)}]"
    if not exact:
        return NOT_EXACT, None, "the candidate does not compute the same bits; its speed is not judged"
    if iv.covers_one:
        return NO_DIFFERENCE, None, f"the {span} of the speedup covers 1: no speed difference is shown"
    direction = "faster" if iv.low > 1.0 else "slower"
    return ACCEPTED, direction, f"the candidate is {direction}: the {span} of the speedup excludes 1"


def run_interval(times: Mapping[str, Sequence[float]], *, steps: int, warmup: int, window: int) -> Interval:
    wins = launch_windows(times, steps=steps, warmup=warmup, window=window)
    return speedup_interval(wins, {label: arm_of(label) for label in wins})


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the audit says beside the owner's headline: interval, per-triplet headlines, diagnostics, context."""
    lines: list[str] = []
    iv = doc.get("interval")
    if isinstance(iv, dict):
        lines.append(f"interval: {iv['words']}")
        lines.append(f"method: {iv['method']}")
        var = iv["variance"]
        lines.append(
            f"variance components (log scale): launch level SD {var['launch_level_sd']:.4f}, window level SD "
            f"{var['window_level_sd']:.4f}, SD of a launch's mean {var['launch_sd']:.4f}"
        )
    rep = doc.get("replication")
    if isinstance(rep, dict):
        for t in rep["triplets"]:
            ratios = " / ".join(f"{r:.4f}" for r in t["ratios"])
            lines.append(
                f"triplet {t['index']} ({' '.join(t['order'])}): headline {t['headline']:.4f}x "
                f"({t['headline_window']}; window ratios {ratios}), max A/B drift {t['max_drift']:.4f}"
            )
    lines += [str(d) for d in doc.get("diagnostics") or []]
    for key in ("calibration", "clock", "quiet_host"):
        block = doc.get(key)
        if isinstance(block, dict) and block.get("words"):
            lines.append(f"{key.replace('_', ' ')}: {block['words']}")
    return lines


def interval_text(doc: Mapping[str, Any]) -> str:
    """' in [low, high] (95%)' beside the headline; empty for an audit written before intervals existed."""
    iv = doc.get("interval")
    if not isinstance(iv, dict):
        return ""
    low = "0" if iv["low"] is None else f"{iv['low']:.4f}"
    high = "inf" if iv["high"] is None else f"{iv['high']:.4f}"
    return f", speedup {iv['estimate']:.4f}x in [{low}, {high}] ({iv['level']:.0%})"
