"""The interval block of audit.json (orch.audit/2) and the lines the reports print beside the owner's headline.

Audits recorded as orch.audit/1 (the unpaired interval of main c30390d) are shown as recorded: verdict_lines reads
both shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ledger.verdict.decide.decision import HOW_TO_BOUND, BaselineEffect, OutlierEffect, WindowEffect
from ledger.verdict.decide.noise import NoiseScale, as_noise
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.stats import TARGET_HALF_WIDTH, Interval, Outlier, Spread, SpreadCheck, width_floor


def _fmt(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:.4f}"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def _spread(s: Spread | None) -> dict[str, Any] | None:
    return None if s is None else {"sd": s.sd, "df": s.df}


def _check_doc(c: SpreadCheck | None) -> dict[str, Any] | None:
    if c is None:
        return None
    words = c.words + ("; the interval falls back to the run's own spread" if c.larger else
                       "; the run is pooled with the calibration")
    return {"run": _spread(c.run), "calibration": _spread(c.calibration), "f": _finite(c.f),
            "p_value": c.p_value, "larger": c.larger, "words": words}


def _noise_words(n: NoiseScale) -> str:
    fit = ", its steps taken about a line in the calibration's step profile" if n.fitted else ""
    return (f", scaled by the candidate's within-launch noise (R = {n.ratio:.3g}{fit}, F({n.d1}, {n.d2}), one-sided "
            f"p = {n.p_value:.3g}: the calibration measured the baseline only; a candidate noisier inside its "
            f"launches is taken to vary more between launches by the same factor)")


def _source_words(iv: Interval, cal_run: str | None) -> str:
    noise = as_noise(iv.noise)
    scaled = "" if noise is None else _noise_words(noise)
    if iv.variance_source == "pooled":
        return f"the run's triplets pooled with A/A calibration run {cal_run}{scaled}"
    if iv.variance_source == "calibration":
        return f"A/A calibration run {cal_run} alone (one triplet has no spread of its own){scaled}"
    if iv.check is not None and iv.check.larger:
        return "the run's own triplets (their spread is larger than the calibration's, which is not used)"
    return "the run's own triplets (no usable calibration)"


def _sequential_summary(block: Mapping[str, Any]) -> dict[str, Any]:
    """The stop in brief (the audit's "sequential" block, ledger/verdict/decide/sequential_doc.py, has every look)."""
    return {
        "rule": block["rule"],
        "max_triplets": block["max_triplets"],
        "target_half_width": block["target_half_width"],
        "first_look": block["first_look"],
        "triplets": block["triplets"],
        "stop": block["stop"],
        "gpu_seconds": block["gpu_seconds"]["decision"],
        "integrity": block["integrity"]["ok"],
    }


def interval_doc(
    iv: Interval, *, headlines: Sequence[float], calibration_run: str | None, window_spread: Spread | None,
    outlier_triplets: Sequence[OutlierEffect], outlier_windows: Sequence[Outlier], triplet_index: Sequence[int],
    rule: SequentialRule | None = None, calibration: Spread | None = None,
    sequential: Mapping[str, Any] | None = None, window_effects: Sequence[WindowEffect] = (),
    calibration_window: Spread | None = None,
    baseline_check: tuple[Sequence[float], Sequence[BaselineEffect]] | None = None,
) -> dict[str, Any]:
    """Everything the verdict read (orch.audit/2 'interval'); triplet_index: the plan's index of triplet i;
    sequential: the audit's "sequential" block of a run under a rule; window_effects: the window check of a
    one-triplet run (issue 34; its keys appear only when the calibration records the step spread)."""
    uses_cal = iv.variance_source in ("pooled", "calibration")
    if iv.bounded:
        df = f"{iv.df}" if iv.noise is None else f"{iv.df:.3g} (the scaled pivot's t multiplier {iv.critical:.4g})"
        words = (f"speedup {_fmt(iv.estimate)}x, {iv.level:.0%} interval [{_fmt(iv.low)}, {_fmt(iv.high)}] (paired "
                 f"over {iv.triplets} triplet(s); SD {iv.sd:.4f} of the per-triplet log speedup, df {df}, from "
                 f"{_source_words(iv, calibration_run)}); half-width {iv.half_width:.1%}")
        floor = width_floor(iv.carried_sd**2, iv.level)
        if iv.triplets_for_target is not None:
            need = f"about {iv.triplets_for_target} triplet(s) would give a +-5% interval at this spread"
        elif floor >= TARGET_HALF_WIDTH:
            need = (f"a +-5% interval is out of reach at any number of triplets: the calibration's A/A mean, "
                    f"subtracted from every triplet, is itself known only to +-{floor:.1%} (more A/A launches, "
                    "pooled by `orch calibrate`, narrow it)")
        else:
            need = "a +-5% interval is out of reach at this spread"
        words += f"; {need}"
    else:
        words = (f"speedup {_fmt(iv.estimate)}x, not bounded: {iv.triplets} triplet and no usable A/A calibration "
                 f"of this protocol on this host; {HOW_TO_BOUND}")
    if rule is not None:
        words += (f"; repeated interval at look {iv.triplets} of at most {rule.max_triplets} (nominal level "
                  f"{iv.nominal_level:.4%} at this look)")
    extra: dict[str, Any] = {}
    n = as_noise(iv.noise)
    if n is not None:
        extra["noise"] = {"ratio": n.ratio, "applied": n.applied(iv.nominal_level), "candidate": _spread(n.candidate),
                          "baseline_step": _spread(n.baseline),
                          "df": [n.d1, n.d2], "p_value": n.p_value, "equivalent_df": iv.df, "words": n.words,
                          **({"profile_fitted": True} if n.fitted else {})}
    if iv.noise is not None and calibration_window is not None:
        extra["window_check"] = _window_check(window_effects, calibration_window, iv.triplets)
        words += f"; window check: {extra['window_check']['words']}"
    if baseline_check is not None and calibration is not None:
        extra["baseline_check"] = _baseline_check(*baseline_check, calibration, triplet_index)
        words += f"; A/B launch check: {extra['baseline_check']['words']}"
    return {
        **extra,
        "estimate": iv.estimate,
        "low": iv.low if iv.bounded else None,
        "high": _finite(iv.high),
        "level": iv.level,
        "nominal_level": iv.nominal_level,
        "method": iv.method if rule is None else f"{iv.method}; {rule.words}",
        "scale": "natural log of the window ratio mean(A_w, B_w) / C_w",
        "triplets": iv.triplets,
        "log_speedups": list(iv.log_speedups),
        "paired_speedups": list(iv.per_triplet),
        "headlines": list(headlines),
        "bounded": iv.bounded,
        "covers_one": iv.covers_one,
        "sd": iv.sd,
        "df": iv.df,
        "variance_source": iv.variance_source,
        "critical": iv.critical,
        "spread_check": _check_doc(iv.check),
        "calibration_used": {"run_id": calibration_run, **(_spread(calibration) or {})} if uses_cal else None,
        "window_spread": _spread(window_spread),
        "half_width": _finite(iv.half_width),
        "triplets_for_5pct": iv.triplets_for_target,
        "outliers": {
            "triplets": [{"triplet": triplet_index[e.outlier.triplet], "z": e.outlier.z, "p_value": e.outlier.p_value,
                          "df": e.outlier.df, "without": [e.without.low if e.without.bounded else None,
                                                          _finite(e.without.high)]}
                         for e in outlier_triplets],
            "windows": [{"triplet": triplet_index[o.triplet], "window": o.window, "z": o.z, "p_value": o.p_value,
                         "df": o.df} for o in outlier_windows],
        },
        "sequential": None if sequential is None else _sequential_summary(sequential),
        "words": words,
    }


def _window_check(effects: Sequence[WindowEffect], window_sd: Spread, triplets: int) -> dict[str, Any]:
    """Outlier windows judged against the calibrated window SD; at K = 1 one never decides alone."""
    if triplets != 1:
        words = "at K >= 2 an outlier window is a diagnostic (an outlier triplet is judged instead)"
    elif not effects:
        words = (f"no window stands apart from its triplet against the calibrated window SD {window_sd.sd:.4f} "
                 f"(df {window_sd.df}, Bonferroni over the windows)")
    else:
        words = "; ".join(
            f"window {e.outlier.window} stands apart (z = {e.outlier.z:.2f} against the calibrated window SD "
            f"{window_sd.sd:.4f}); without it {e.without[0]:.4f}x in [{_fmt(e.without[1])}, {_fmt(e.without[2])}]"
            for e in effects) + "; the decision must hold without it"
    return {"window_sd": _spread(window_sd),
            "windows": [{"window": e.outlier.window, "z": e.outlier.z, "p_value": e.outlier.p_value,
                         "without": list(e.without)} for e in effects], "words": words}


def _baseline_check(us: Sequence[float], effects: Sequence[BaselineEffect], calibration: Spread,
                    triplet_index: Sequence[int]) -> dict[str, Any]:
    """Each triplet's A/B disagreement judged against the calibrated between-launch spread (noise.baseline_outliers):
    a flagged triplet never decides alone; at K = 1 the run is then not decided."""
    scale = f"the calibrated between-launch SD {calibration.sd:.4f} x sqrt(4/3) (df {calibration.df}, Bonferroni " \
            f"over {len(us)} triplet(s), 5 %)"
    if not effects:
        words = (f"the baseline launches A and B of every triplet agree within {scale}: no whole-launch outlier of the "
                 "baseline is seen (a slow candidate launch cannot be told from a slowdown at K = 1)")
    else:
        words = "; ".join(
            f"triplet {triplet_index[e.outlier.triplet]}'s A/B = {e.disagreement:.4f} stands apart (z = "
            f"{e.outlier.z:.2f} against {scale}); " + ("at K = 1 nothing is left without it" if e.without is None else
                                                      f"without it [{_fmt(e.without.low)}, {_fmt(e.without.high)}]")
            for e in effects) + "; the decision must hold without it"
    return {"calibration_sd": _spread(calibration), "factor": 4.0 / 3.0, "ab_log_ratios": list(us),
            "triplets": [{"triplet": triplet_index[e.outlier.triplet], "ab_ratio": e.disagreement, "z": e.outlier.z,
                          "p_value": e.outlier.p_value,
                          "without": None if e.without is None else [e.without.low if e.without.bounded else None,
                                                                    _finite(e.without.high)]}
                         for e in effects], "words": words}


def _legacy_lines(iv: Mapping[str, Any]) -> list[str]:
    """An orch.audit/1 interval (unpaired, as recorded)."""
    var = iv["variance"]
    return [
        f"interval: {iv['words']}",
        f"method: {iv['method']}",
        f"variance components (log scale): launch level SD {var['launch_level_sd']:.4f}, window level SD "
        f"{var['window_level_sd']:.4f}, SD of a launch's mean {var['launch_sd']:.4f}",
    ]


def _paired_lines(iv: Mapping[str, Any]) -> list[str]:
    lines = [f"interval: {iv['words']}", f"method: {iv['method']}"]
    if iv.get("spread_check"):
        lines.append(f"spread check: {iv['spread_check']['words']}")
    ws = iv.get("window_spread")
    if ws:
        lines.append(f"within-triplet SD between windows (log scale): {ws['sd']:.4f} (df {ws['df']})")
    return lines


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """What the audit says beside the owner's headline: interval, per-triplet speedups, diagnostics, context."""
    lines: list[str] = []
    iv = doc.get("interval")
    if isinstance(iv, dict):
        lines += _legacy_lines(iv) if "variance" in iv else _paired_lines(iv)
    rep = doc.get("replication")
    if isinstance(rep, dict):
        for t in rep["triplets"]:
            ratios = " / ".join(f"{r:.4f}" for r in t["ratios"])
            paired = f"paired speedup {t['paired_speedup']:.4f}x, " if "paired_speedup" in t else ""
            lines.append(
                f"triplet {t['index']} ({' '.join(t['order'])}): {paired}headline {t['headline']:.4f}x "
                f"({t['headline_window']}; window ratios {ratios}), max A/B drift {t['max_drift']:.4f}"
            )
    seq = doc.get("sequential")
    if isinstance(seq, dict):
        lines.append(f"sequential: {seq['words']}")
        lines += [f"  {look['words']}" for look in seq.get("looks") or []]
    lines += [str(d) for d in doc.get("diagnostics") or []]
    for key in ("calibration", "clock", "quiet_host", "host_watch"):
        block = doc.get(key)
        if isinstance(block, dict) and block.get("words"):
            lines.append(f"{key.replace('_', ' ')}: {block['words']}")
    return lines


def interval_text(doc: Mapping[str, Any]) -> str:
    """' in [low, high] (95%)' beside the headline; empty for an audit written before intervals existed."""
    iv = doc.get("interval")
    if not isinstance(iv, dict):
        return ""
    if iv.get("bounded") is False:
        return f", speedup {iv['estimate']:.4f}x, not bounded yet"
    low = "0" if iv["low"] is None else f"{iv['low']:.4f}"
    high = "inf" if iv["high"] is None else f"{iv['high']:.4f}"
    return f", speedup {iv['estimate']:.4f}x in [{low}, {high}] ({iv['level']:.0%})"


def audit_note(doc: Mapping[str, Any]) -> str:
    """The audit's ledger note (at most 200 characters): verdict, interval, triplets, variance source."""
    verdict = f"verdict: {doc['verdict']}" + (f" ({doc['direction']})" if doc.get("direction") else "")
    iv = doc.get("interval")
    if not isinstance(iv, dict) or "variance" in iv or doc["verdict"] == "not exact":  # speed not judged
        return verdict
    if not iv["bounded"]:
        return f"{verdict}; speedup {iv['estimate']:.4f}x not bounded (1 triplet, no calibration)"
    cal = (iv.get("calibration_used") or {}).get("run_id")
    source = {"pooled": f"SD pooled with A/A run {cal}", "calibration": f"SD of A/A run {cal}"}.get(
        iv["variance_source"], "SD of the run's triplets")
    seq = iv.get("sequential")
    stop = f", {seq['stop'] or 'no stop'} at K={seq['triplets']}, {seq['gpu_seconds']:.0f} GPU-s" if seq else ""
    high = "inf" if iv["high"] is None else f"{iv['high']:.4f}"
    return (f"{verdict}; speedup {iv['estimate']:.4f}x [{iv['low']:.4f}, {high}] {iv['level']:.0%}, "
            f"K={iv['triplets']}, df {iv['df']}, {source}{stop}")[:200]
