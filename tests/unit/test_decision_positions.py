"""What the audit records of launch positions (issue 52; ledger/verdict/decide/decision.py): each triplet's position
levels, its A/B log ratio u beside the u its calibration expects, and the calibration's position effect, worked by
hand; and a flagged window's effect under a candidate noisier than the floor, where the run's noise scale counts."""

from __future__ import annotations

import dataclasses
import math

import pytest
from test_decision_branches import _one_triplet

from ledger.verdict.decide.decision import position_levels, positions_doc, window_effects
from ledger.verdict.decide.noise import without_window
from ledger.verdict.decide.stats import Outlier, Position, Spread
from ledger.verdict.decide.windows import speedup
from protocol.plan import Triplet

# 16 steps, warm-up 10, windows of 2: window times A 2, 2, 2; C 1, 1, 1; B 2.2, 2.4, 2.6 (a step is half its window)
STEPS = {"A": [1.0] * 16, "C": [0.5] * 16, "B": [1.0] * 10 + [1.1, 1.1, 1.2, 1.2, 1.3, 1.3]}
SP = speedup(STEPS, steps=16, warmup=10, window=2, drift_bound=0.02)
LA, LC = math.log(2.0), math.log(1.0)
LB = (math.log(2.2) + math.log(2.4) + math.log(2.6)) / 3.0
MEAN = (LA + LC + LB) / 3.0  # not 0: a level is its launch's mean log window time less this
U = (math.log(2.0 / 2.2) + math.log(2.0 / 2.4) + math.log(2.0 / 2.6)) / 3.0
ACB = Triplet(index=1, a="A1", c="C1", b="B1", order=("A1", "C1", "B1"))
BCA = Triplet(index=2, a="A2", c="C2", b="B2", order=("B2", "C2", "A2"))


def test_position_levels_are_each_positions_mean_log_window_time_less_the_three_means() -> None:
    assert position_levels(ACB, SP) == pytest.approx([LA - MEAN, LC - MEAN, LB - MEAN], abs=1e-15)
    assert position_levels(BCA, SP) == pytest.approx([LB - MEAN, LC - MEAN, LA - MEAN], abs=1e-15)  # A and B swap
    assert math.fsum(position_levels(ACB, SP)) == pytest.approx(0.0, abs=1e-15)


def test_positions_doc_without_a_calibration_expects_no_order_effect() -> None:
    assert positions_doc([ACB], [SP], None) == {
        "triplets": [{"index": 1, "order": ["A1", "C1", "B1"], "ab_log_ratio": pytest.approx(U, abs=1e-15),
                      "expected_ab_log_ratio": 0.0, "levels": pytest.approx([LA - MEAN, LC - MEAN, LB - MEAN])}],
        "calibration": None,
        "words": "no calibration: the run's d is not corrected for launch positions",
    }  # fmt: skip
    # a calibration recorded before positions were: no effect to subtract, none expected
    assert positions_doc([ACB], [SP], Spread(0.05, 4))["triplets"][0]["expected_ab_log_ratio"] == 0.0  # type: ignore[index]
    assert positions_doc([ACB], [SP], Spread(0.05, 4))["calibration"] is None


def test_positions_doc_with_a_calibration_carries_its_effect_and_the_u_of_each_order() -> None:
    cal = Spread(0.05, 4, Position(d=0.01, u=-0.02, launches=5))
    assert positions_doc([ACB, BCA], [SP, SP], cal) == {
        "triplets": [
            {"index": 1, "order": ["A1", "C1", "B1"], "ab_log_ratio": pytest.approx(U, abs=1e-15),
             "expected_ab_log_ratio": -0.02, "levels": pytest.approx([LA - MEAN, LC - MEAN, LB - MEAN])},
            {"index": 2, "order": ["B2", "C2", "A2"], "ab_log_ratio": pytest.approx(U, abs=1e-15),
             "expected_ab_log_ratio": 0.02, "levels": pytest.approx([LB - MEAN, LC - MEAN, LA - MEAN])},
        ],
        "calibration": {"mean_log_speedup": 0.01, "mean_ab_log_ratio": -0.02, "launches": 5},
        "words": "the calibration's A/A mean speedup 1.0101x over 5 launches (the launch positions' effect on d) is "
                 "subtracted from each triplet's d, its variance carried; the A/B launch check centres u on the A/A "
                 "mean A/B 0.9802x of its order",
    }  # fmt: skip


def test_positions_doc_refuses_speedups_that_do_not_match_the_triplets() -> None:
    with pytest.raises(ValueError):
        positions_doc([ACB, BCA], [SP], None)


def test_a_flagged_windows_effect_is_scaled_by_a_candidate_noisier_than_the_floor() -> None:
    ratios, iv, cal, window_sd = _one_triplet()
    assert iv.noise is not None
    noisy = dataclasses.replace(iv, noise=dataclasses.replace(iv.noise, ratio=4.0))  # type: ignore[type-var]
    flagged = [Outlier(0, 1, -8.0, 1e-8, 10)]
    (eff,) = window_effects(ratios, flagged, noisy, cal, window_sd)
    assert eff.without == without_window(ratios[0], 1, cal, window_sd, noisy.noise, 0.95)  # type: ignore[arg-type]
    plain = without_window(ratios[0], 1, cal, window_sd, None, 0.95)
    assert eff.without[0] == pytest.approx(plain[0])  # the same estimate
    assert eff.without[2] - eff.without[1] > 1.5 * (plain[2] - plain[1])  # a wider interval: R = 4 counts
