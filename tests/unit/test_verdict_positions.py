"""Issue 52: a steadier candidate never narrows the K = 1 interval, launch-position effects are subtracted and checked,
and calibrations expire, must share the run's CPU, kernel and GPUs, and are pooled rather than chosen."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from test_audit import RunSpec, make_run, record_calibration, synthetic_protocol_id
from test_calibrate import RECORDED_HOST, _synthetic_protocol_id

from ledger.verdict.decide import dist
from ledger.verdict.decide.calibration import fingerprint
from ledger.verdict.decide.noise import NoiseScale, baseline_outliers, critical_scaled, ratio_floor
from ledger.verdict.decide.stats import Position, Spread, paired_interval
from ledger.verdict.documents.audit import audit_run

T4 = float(dist.t_ppf(0.975, 4))  # 2.7764451051977987


def _scale(ratio: float, launches: int = 0) -> NoiseScale:
    return NoiseScale(ratio, Spread(0.01, 5), Spread(0.02, 55), 4, launches)


def test_ratio_floor_is_the_calibrations_own_t_over_the_scaled_pivots_critical_value() -> None:
    c = critical_scaled(0.95, 4, 5, 55)
    assert c == pytest.approx(3.5479117649532212, rel=1e-9)
    assert ratio_floor(0.95, 4, 5, 55) == pytest.approx((T4 / c) ** 2, rel=1e-12)
    assert ratio_floor(0.95, 4, 5, 55) == pytest.approx(0.61239630, rel=1e-6)


@pytest.mark.parametrize("ratio", [1 / 3, 0.5, 0.6])
def test_a_steadier_candidate_gets_exactly_the_calibrations_own_one_triplet_interval(ratio: float) -> None:
    """R = 1/3 (a candidate that captures CUDA graphs): issue 34 scaled the calibration by sqrt(R) (0.58x as wide at
    the same critical value); the interval is now t_4 * s_cal, the calibration's own, and no narrower."""
    cal = Spread(0.1, 4)
    iv = paired_interval([0.0], cal, noise=_scale(ratio))
    assert math.log(iv.high) == pytest.approx(T4 * 0.1, rel=1e-9)
    assert math.log(iv.high) > 3.5479117649532212 * 0.1 * math.sqrt(ratio)  # issue 34's width: narrower


def test_a_noisier_candidate_still_widens_by_sqrt_r() -> None:
    cal = Spread(0.1, 4)
    iv = paired_interval([0.0], cal, noise=_scale(4.0))
    assert math.log(iv.high) == pytest.approx(3.5479117649532212 * 0.1 * 2.0, rel=1e-6)
    assert "never below the calibration's own one-triplet interval" in _scale(0.3).words


def test_the_calibrations_mean_is_subtracted_and_its_variance_carried() -> None:
    """d - m over n = 5 A/A launches: var s^2 (1 + 1/5), exact t with the calibration's df at K = 1."""
    cal = Spread(0.05, 4, Position(0.1, 0.0, 5))
    iv = paired_interval([0.1], cal)
    assert iv.estimate == pytest.approx(1.0, abs=1e-15)
    assert math.log(iv.high) == pytest.approx(T4 * 0.05 * math.sqrt(1.2), rel=1e-12)
    two = paired_interval([0.18, 0.22], cal)  # K = 2: pooled SD, the carried term sd_cal^2 / n added to s^2 / K
    assert math.log(two.estimate) == pytest.approx(0.1, rel=1e-12)
    assert two.sd is not None and (two.variance_source, two.df) == ("pooled", 5)
    half = float(dist.t_ppf(0.975, 5)) * math.sqrt(two.sd**2 / 2 + 0.05**2 / 5)
    assert math.log(two.high) - math.log(two.estimate) == pytest.approx(half, rel=1e-12)
    assert paired_interval([0.1], Spread(0.05, 4)).estimate == pytest.approx(math.exp(0.1))  # no position: as before


def test_a_middle_launch_slower_is_not_a_slowdown_once_the_calibration_measured_it() -> None:
    """Normal d with the same position effect (the middle launch 30 % slower: d = -log 1.3) in the calibration and the
    run: with the correction the K = 1 interval covers 0 about 95 % of the time (exact t); without it, it mostly
    calls the null slower (seeded, 4,000 draws: +-0.7 points)."""
    rng = np.random.default_rng(52)
    shift, sd, n = -math.log(1.3), 0.1, 4000
    wrong = wrong_plain = 0
    for _ in range(n):
        aa = shift + sd * rng.standard_normal(5)
        d = [float(shift + sd * rng.standard_normal())]
        plain = Spread.of(list(aa))
        assert plain is not None
        corrected = Spread(plain.sd, plain.df, Position(float(aa.mean()), 0.0, 5))
        wrong += not paired_interval(d, corrected).covers_one
        wrong_plain += not paired_interval(d, plain).covers_one
    assert wrong / n == pytest.approx(0.05, abs=0.01)
    assert wrong_plain / n > 0.3


def test_the_ab_check_centres_u_on_the_calibrations_mean_u_of_its_order() -> None:
    """B 30 % slower in every launch: u = -log 1.3 in an A C B triplet, +log 1.3 in a B C A one."""
    u = -math.log(1.3)
    plain = Spread(0.05, 4)
    centred = Spread(0.05, 4, Position(0.0, u, 5))
    assert [o.triplet for o in baseline_outliers([u], plain)] == [0]  # against 0 it is an outlier
    assert baseline_outliers([u, -u], centred) == []  # against its order's A/A mean u it is not
    flagged = baseline_outliers([u, u], centred)  # the second triplet's order is B C A: +log 1.3 is expected
    assert [o.triplet for o in flagged] == [1]
    assert flagged[0].z == pytest.approx(2 * u / (0.05 * math.sqrt(4 / 3 * 1.2)), rel=1e-12)


def test_fingerprint_keys_not_recorded_are_left_out() -> None:
    old = {"host_hash": "h", "gpu_model": "none", "cpu_model": None, "kernel": None}
    assert fingerprint(old) == {"host_hash": "h", "gpu_model": "none"}
    assert fingerprint({**old, "cpu_model": "X"}) != fingerprint(old)


def test_every_valid_calibration_is_pooled_not_the_newest(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    record_calibration(tmp_path, "cal-a", pid, RECORDED_HOST, sd=0.1, df=4)
    record_calibration(tmp_path, "cal-b", pid, RECORDED_HOST, sd=0.02, df=4)  # calibrating again, smaller SD
    make_run(tmp_path, "run1")
    doc = audit_run(tmp_path, "run1").document
    block, iv = doc["calibration"], doc["interval"]
    assert (block["pooled"], block["df"], block["run_id"]) == (2, 8, "cal-b")
    assert block["sd"] == pytest.approx(math.sqrt((0.1**2 + 0.02**2) / 2), rel=1e-12)
    assert [c["run_id"] for c in block["calibrations"]] == ["cal-b", "cal-a"]
    assert block["position"] == {"mean_log_speedup": 0.0, "mean_ab_log_ratio": 0.0, "launches": 10,
                                 "ab_launches": 0}
    assert block["age_days"] == 0.0 and "2 A/A calibrations of this workload on this host pooled" in block["words"]
    assert (iv["sd"], iv["df"]) == (pytest.approx(block["sd"]), 8)
    assert doc["positions"]["calibration"] == {"mean_log_speedup": 0.0, "mean_ab_log_ratio": 0.0, "launches": 10}
    assert doc["statistics_rules"] == "issue-50"


def test_the_audit_says_when_the_aa_means_own_error_puts_5pct_out_of_reach(tmp_path: Path) -> None:
    """Issue 50: a calibration of 5 launches at SD 0.2 knows its A/A mean to +-19%, which every triplet carries: no
    number of triplets gives +-5%, and the audit says what would (more A/A launches), not a K."""
    pid = _synthetic_protocol_id(tmp_path)
    record_calibration(tmp_path, "cal", pid, RECORDED_HOST, sd=0.2, df=4)
    make_run(tmp_path, "run1")
    iv = audit_run(tmp_path, "run1").document["interval"]
    assert iv["triplets_for_5pct"] is None
    assert ("a +-5% interval is out of reach at any number of triplets: the calibration's A/A mean, subtracted from "
            "every triplet, is itself known only to +-19.2%") in iv["words"]
    record_calibration(tmp_path, "cal-2", pid, RECORDED_HOST, sd=0.02, df=4)  # pooled: SD 0.142 over 10 launches
    make_run(tmp_path, "run2")
    iv = audit_run(tmp_path, "run2").document["interval"]
    assert iv["triplets_for_5pct"] is None and "known only to +-9.2%" in iv["words"]


def test_an_expired_calibration_is_not_used_and_the_verdict_says_why(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    record_calibration(tmp_path, "cal-old", pid, RECORDED_HOST, recorded_at="2024-12-20T00:00:00Z")  # 12 days
    make_run(tmp_path, "run1")
    doc = audit_run(tmp_path, "run1").document
    assert doc["calibration"]["found"] is False and doc["calibration"]["expired"] is True
    assert doc["verdict"] == "no difference shown" and doc["interval"]["sd"] is None
    assert any("recorded 12.0 days before this run, more than measurement.calibration_max_age_days (7)" in r
               for r in doc["reasons"])


def test_the_protocols_own_maximum_age_decides_which_calibration_has_expired(tmp_path: Path) -> None:
    """measurement.calibration_max_age_days = 30: a calibration 12 days old is used (the default, 7, would not)."""
    pid = synthetic_protocol_id(max_age_days=30)
    record_calibration(tmp_path, "cal-old", pid, RECORDED_HOST, recorded_at="2024-12-20T00:00:00Z")  # 12 days
    make_run(tmp_path, "run1", RunSpec(calibration_max_age_days=30))
    doc = audit_run(tmp_path, "run1").document
    assert doc["calibration"]["found"] is True and doc["calibration"]["age_days"] == pytest.approx(12.0), doc["reasons"]
    assert doc["interval"]["variance_source"] == "calibration"


def test_a_calibration_of_another_cpu_kernel_or_gpus_is_not_used(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    record_calibration(tmp_path, "cal-x", pid, {**RECORDED_HOST, "cpu_model": "another CPU"})
    make_run(tmp_path, "run1")
    block = audit_run(tmp_path, "run1").document["calibration"]
    assert block["found"] is False and "host fingerprint differs (cpu_model)" in block["words"]


def test_the_position_effect_of_any_calibration_with_a_df_and_a_launch_is_subtracted() -> None:
    """The boundaries: a calibration of df 1 and a mean over 1 launch still correct d; df 0 (no spread) or a mean of 0
    launches (recorded before positions were) leave d as it is, and nothing is divided by 0."""
    one = paired_interval([0.1], Spread(0.05, 1, Position(0.1, 0.0, 1)))
    assert one.estimate == pytest.approx(1.0, abs=1e-15)
    assert math.log(one.high) == pytest.approx(float(dist.t_ppf(0.975, 1)) * 0.05 * math.sqrt(2.0), rel=1e-12)
    none = paired_interval([0.1], Spread(0.05, 4, Position(0.1, 0.0, 0)))
    assert none.estimate == pytest.approx(math.exp(0.1), rel=1e-15)
    assert math.log(none.high / none.estimate) == pytest.approx(T4 * 0.05, rel=1e-12)  # nothing carried
    flat = paired_interval([0.1, 0.3], Spread(0.05, 0, Position(0.1, 0.0, 5)))  # df 0: the run's own spread
    assert flat.estimate == pytest.approx(math.exp(0.2), rel=1e-15) and flat.variance_source == "run"
