"""The verdict's branches that only a flagged window, a flagged A/B triplet or an unnamed triplet reach
(ledger/verdict/decide/decision.py), pinned where mutation testing found them untested: the direction of each check, its
boundary at 1, and how the sentence names what it refused."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from ledger.verdict.decide.decision import (
    ACCEPTED,
    NO_DIFFERENCE,
    BaselineEffect,
    OutlierEffect,
    WindowEffect,
    ab_check,
    baseline_effects,
    decide,
    drift_notes,
    outlier_effects,
    outlier_notes,
    triplet_speedups,
    window_effects,
)
from ledger.verdict.decide.noise import NoiseEvidence, arm_spread, noise_scale, ratio_floor, without_window
from ledger.verdict.decide.stats import Interval, Outlier, Spread, paired_interval
from protocol.plan import Triplet


def _iv(low: float, high: float, *, triplets: int = 2) -> Interval:
    return Interval(estimate=math.sqrt(low * high) if math.isfinite(high) else low, low=low, high=high, level=0.95,
                    nominal_level=0.95, method="m", triplets=triplets,
                    log_speedups=(0.1, 0.2)[:triplets], sd=0.1, df=4, variance_source="calibration", critical=2.0,
                    check=None, triplets_for_target=None)


def _trip(i: int) -> Triplet:
    return Triplet(index=i, a=f"A{i}", c=f"C{i}", b=f"B{i}", order=(f"A{i}", f"C{i}", f"B{i}"))


WIN = Outlier(triplet=0, window=1, z=-6.0, p_value=1e-6, df=10)


@pytest.mark.parametrize(("iv", "without", "verdict"), [
    (_iv(1.2, 1.8, triplets=1), (1.3, 1.1, 1.5), ACCEPTED),  # faster, and faster without the window
    (_iv(1.2, 1.8, triplets=1), (1.1, 1.0, 1.3), NO_DIFFERENCE),  # low == 1 without it: not shown faster
    (_iv(1.2, 1.8, triplets=1), (1.1, 0.9, 1.3), NO_DIFFERENCE),
    (_iv(0.5, 0.8, triplets=1), (0.6, 0.5, 0.9), ACCEPTED),  # slower, and slower without it
    (_iv(0.5, 0.8, triplets=1), (0.7, 0.5, 1.0), NO_DIFFERENCE),  # high == 1 without it: not shown slower
    (_iv(0.5, 0.8, triplets=1), (1.6, 1.2, 2.0), NO_DIFFERENCE),  # faster without it: the window decided
])
def test_a_flagged_window_decides_nothing_unless_the_interval_without_it_points_the_same_way(
        iv: Interval, without: tuple[float, float, float], verdict: str) -> None:
    got, direction, sentence = decide(True, iv, windows=[WindowEffect(WIN, without)], window_names=["w1", "w2"])
    assert got == verdict
    if verdict == NO_DIFFERENCE:
        assert direction is None
        assert sentence.endswith(f"excludes 1 only with window w2, an outlier against the calibrated window SD "
                                 f"(z = -6.00): without it the speedup is {without[0]:.4f}x in [{without[1]:.4f}, "
                                 f"{without[2]:.4f}]; one window does not decide at K = 1")


def test_a_flagged_window_is_named_by_position_when_no_names_are_given() -> None:
    refused = WindowEffect(WIN, (1.0, 0.9, 1.1))
    assert "only with window 2," in decide(True, _iv(1.2, 1.8, triplets=1), windows=[refused])[2]
    # a name list too short for the window: its position
    assert "only with window 2," in decide(True, _iv(1.2, 1.8, triplets=1), windows=[refused], window_names=["w1"])[2]
    # a window flag that carries no window index is the triplet's first window
    whole = WindowEffect(Outlier(0, None, 5.0, 1e-5, 10), (1.0, 0.9, 1.1))
    assert "only with window w1," in decide(True, _iv(1.2, 1.8, triplets=1), windows=[whole],
                                            window_names=["w1", "w2"])[2]


def test_an_outlier_triplet_and_an_ab_triplet_are_named_by_position_when_no_names_are_given() -> None:
    out = OutlierEffect(Outlier(1, None, 4.0, 1e-4, 6), _iv(0.9, 1.3))
    assert "only with triplet 2, an outlier" in decide(True, _iv(1.2, 1.8), (), [out])[2]
    ab = BaselineEffect(Outlier(1, None, 5.0, 1e-5, 4), 1.4, _iv(0.9, 1.3))
    sentence = decide(True, _iv(1.2, 1.8), baselines=[ab])[2]
    assert "the baseline launches A and B of triplet 2 disagree" in sentence


def test_the_ab_sentences_say_what_happened_and_what_to_do() -> None:
    flagged = Outlier(0, None, 5.25, 2e-5, 4)
    alone = decide(True, _iv(1.2, 1.8, triplets=1), baselines=[BaselineEffect(flagged, 1.4, None)])
    assert alone == (NO_DIFFERENCE, None, (
        "the 95% interval [1.2000, 1.8000] excludes 1, but the baseline launches A and B of triplet 1 disagree beyond "
        "the calibrated between-launch spread (A/B = 1.4000, z = 5.25, p = 2e-05): one of them is likely a "
        "whole-launch outlier, which moves the speedup by half its size; one triplet has nothing to decide without "
        "it: re-run, or set measurement.repeats >= 2"))
    unbounded = _iv(0.9, math.inf)
    rest = decide(True, _iv(1.2, 1.8), baselines=[BaselineEffect(flagged, 1.4, unbounded)], triplet_names=["7", "8"])
    assert rest[0] == NO_DIFFERENCE and rest[2].endswith(
        "A/B = 1.4000, z = 5.25, p = 2e-05): one of them is likely a whole-launch outlier, which moves the speedup by "
        "half its size; without that triplet the interval is [0.9000, inf]; one triplet does not decide")
    assert " of triplet 7 disagree" in rest[2]
    # the same decision without it: a diagnostic only
    assert decide(True, _iv(1.2, 1.8), baselines=[BaselineEffect(flagged, 1.4, _iv(1.1, 1.9))])[0] == ACCEPTED


def test_the_ab_check_needs_every_triplets_contrast_and_says_how_many_it_got() -> None:
    with pytest.raises(ValueError, match=r"needs each triplet's A/B contrast: 1 for 2 triplets"):
        ab_check(_iv(1.2, 1.8), [0.0], [0.1, 0.2], Spread(0.05, 4), None, None)


def test_baseline_effects_apply_only_with_a_calibration_that_records_the_step_spread() -> None:
    flagged = [Outlier(0, None, 6.0, 1e-6, 4)]
    cal = Spread(0.05, 4)
    assert baseline_effects([0.4, 0.0], flagged, [0.1, 0.2], cal, None, None) == []
    assert baseline_effects([0.4, 0.0], flagged, [0.1, 0.2], cal, None, NoiseEvidence((None, None), None)) == []
    assert baseline_effects([0.4, 0.0], flagged, [0.1, 0.2], None, None,
                            NoiseEvidence((None, None), Spread(0.01, 50))) == []
    (eff,) = baseline_effects([0.4, 0.0], flagged, [0.1, 0.2], cal, None,
                              NoiseEvidence((None, None), Spread(0.01, 50)))
    assert eff.outlier is flagged[0] and eff.disagreement == pytest.approx(math.exp(0.4))
    assert eff.without == paired_interval([0.2], cal)


def test_outlier_effects_keep_the_flag_they_judge() -> None:
    out = Outlier(2, None, 5.0, 1e-4, 4)
    (eff,) = outlier_effects([0.1, 0.12, 0.5], [out], Spread(0.02, 4), None)
    assert eff.outlier is out


def _one_triplet() -> tuple[list[list[float]], Interval, Spread, Spread]:
    rng = np.random.default_rng(5)
    steps = {role: list(1.0 + 0.01 * rng.standard_normal(12)) for role in ("A", "C", "B")}
    ratios = [[1.0, 0.7, 1.02]]  # window 2 of the candidate stands apart
    cal, window_sd = Spread(0.02, 4), Spread(0.015, 10)
    scale = noise_scale(arm_spread([steps]), Spread(0.01, 50), cal)
    assert scale is not None
    d = [float(np.mean(np.log(ratios[0])))]
    return ratios, paired_interval(d, cal, noise=scale), cal, window_sd


def test_window_effects_use_the_runs_noise_scale_and_only_at_one_triplet_with_every_input() -> None:
    ratios, iv, cal, window_sd = _one_triplet()
    flagged = [Outlier(0, 1, -8.0, 1e-8, 10)]
    (eff,) = window_effects(ratios, flagged, iv, cal, window_sd)
    assert eff.outlier is flagged[0]
    assert eff.without == without_window(ratios[0], 1, cal, window_sd, iv.noise, iv.nominal_level)  # type: ignore[arg-type]
    # R here is below the floor (issue 52): the scaled interval is exactly the calibration's own, never narrower
    assert iv.noise is not None and iv.noise.ratio < ratio_floor(0.95, 4, iv.noise.d1, iv.noise.d2)  # type: ignore[attr-defined]
    assert eff.without == pytest.approx(without_window(ratios[0], 1, cal, window_sd, None, iv.nominal_level), rel=1e-9)
    noisy = dataclasses.replace(iv.noise, ratio=4.0)  # type: ignore[type-var]
    assert without_window(ratios[0], 1, cal, window_sd, noisy, 0.95) != eff.without  # above it, the scale counts
    assert eff.without != without_window(ratios[0], 0, cal, window_sd, iv.noise, iv.nominal_level)  # type: ignore[arg-type]
    assert window_effects(ratios, flagged, iv, cal, None) == []  # no calibrated window SD
    assert window_effects(ratios, flagged, iv, None, window_sd) == []  # no calibration
    two = dataclasses.replace(iv, triplets=2)  # scaled, but of two triplets: a window is a diagnostic there
    assert two.noise is not None and window_effects(ratios * 2, flagged, two, cal, window_sd) == []
    assert window_effects(ratios, [Outlier(0, None, 5.0, 1e-5, 10)], iv, cal, window_sd) == []  # not a window
    (short,) = window_effects([[1.0, 0.7]], flagged, iv, cal, window_sd)  # two windows: one is left without it
    assert short.without[0] == pytest.approx(1.0)
    assert window_effects([[0.7]], [Outlier(0, 0, -8.0, 1e-8, 10)], iv, cal, window_sd) == []  # nothing left


def test_drift_notes_refuse_speedups_that_do_not_match_the_triplets() -> None:
    times = {"A1": [1.0] * 4, "C1": [1.0] * 4, "B1": [1.0] * 4}
    sps = triplet_speedups(times, [_trip(1)], steps=4, warmup=2, window=2, drift_bound=0.5)
    with pytest.raises(ValueError):
        drift_notes([_trip(1), _trip(2)], sps, 0.1)


def test_outlier_notes_name_a_window_of_a_single_triplet_without_the_triplet_and_an_unnamed_window_by_index() -> None:
    (one,) = outlier_notes([_trip(1)], [], [Outlier(0, 1, 3.0, 0.002, 4)], ["w1", "w2"])
    assert one.startswith("outlier window: window w2 stands apart")
    (two,) = outlier_notes([_trip(1), _trip(2)], [], [Outlier(1, 2, 3.0, 0.002, 4)], ["w1", "w2"])
    assert two.startswith("outlier window: triplet 2 window 2 stands apart")  # no name for window index 2
    (three,) = outlier_notes([_trip(1)], [], [Outlier(0, 2, 3.0, 0.002, 4)], ["w1", "w2", "w3"])
    assert three.startswith("outlier window: window w3 stands apart")


def test_the_sentence_uses_the_plans_triplet_names_and_every_busy_window() -> None:
    out = OutlierEffect(Outlier(1, None, 4.0, 1e-4, 6), _iv(0.9, 1.3))
    assert "only with triplet 8, an outlier" in decide(True, _iv(1.2, 1.8), (), [out], ["7", "8"])[2]
    busy = ["train-C1 w1: foreign processes", "train-C1 w2: a foreign GPU process"]
    assert "busy window(s): train-C1 w1: foreign processes; train-C1 w2: a foreign GPU process; not accepted" in decide(
        True, _iv(1.2, 1.8), busy)[2]
