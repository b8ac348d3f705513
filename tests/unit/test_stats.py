"""The paired verdict statistics (ledger/verdict/stats.py): quantiles against scipy and published tables, the
pooling arithmetic worked by hand, the spread check and its fallback, K = 1 with and without a calibration, the
outlier diagnostics with a planted outlier, invariants (hypothesis) and a seeded Monte Carlo of coverage.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from ledger.verdict.stats import (
    LEVEL,
    Spread,
    outlier_triplets,
    outlier_windows,
    paired_interval,
    pooled,
    spread_check,
    t_critical,
    triplet_log_speedup,
    triplets_needed,
    variance_for,
    window_spread,
)
from ledger.verdict.windows import speedup

# Published two-sided 95% Student t multipliers t(0.975, df).
T975 = {1: 12.7062047, 2: 4.3026527, 4: 2.7764451, 6: 2.4469119, 7: 2.3646243, 8: 2.3060041}


@pytest.mark.parametrize("df", sorted(T975))
def test_t_critical_matches_published_tables_and_scipy(df: int) -> None:
    assert t_critical(0.95, df) == pytest.approx(T975[df], abs=2e-7)
    for level in (0.8, 0.9, 0.95, 0.99, 0.9987):
        assert t_critical(level, df) == pytest.approx(sps.t.ppf(0.5 + level / 2, df), rel=1e-12)
    assert t_critical(0.95, 10**9) == pytest.approx(1.9599640, abs=1e-6)


def test_triplet_log_speedup_is_the_mean_log_window_ratio() -> None:
    assert triplet_log_speedup([math.exp(0.1), math.exp(0.2), math.exp(0.3)]) == pytest.approx(0.2, rel=1e-12)
    assert triplet_log_speedup([2.0]) == pytest.approx(math.log(2.0), rel=1e-12)
    for bad in ([], [1.0, 0.0], [1.0, -2.0], [math.inf], [math.nan]):
        with pytest.raises(ValueError, match=r"^window ratios must be finite and positive"):
            triplet_log_speedup(bad)


def test_spread_and_pooling_arithmetic() -> None:
    s = Spread.of([1.0, 2.0, 3.0])
    assert s is not None and (s.sd, s.df) == (pytest.approx(1.0, rel=1e-12), 2)
    assert Spread.of([0.3]) is None and Spread.of([]) is None
    # df-weighted variances: (2 * 0.01 + 4 * 0.04) / 6 = 0.03
    p = pooled(Spread(0.1, 2), Spread(0.2, 4))
    assert (p.sd, p.df) == (pytest.approx(math.sqrt(0.03), rel=1e-12), 6)
    one = pooled(Spread(0.3, 5))
    assert (one.sd, one.df) == (pytest.approx(0.3, rel=1e-12), 5)
    with pytest.raises(ValueError, match="at least one degree of freedom"):
        pooled(Spread(0.1, 0))


def test_window_spread_pools_residuals_about_each_triplets_mean() -> None:
    # triplet 1 logs (0.1, 0.2, 0.3): ss 0.02, df 2; triplet 2 logs (0, 0.4): ss 0.08, df 1; a one-window triplet adds
    # nothing. SD = sqrt(0.10 / 3)
    ratios = [[math.exp(0.1), math.exp(0.2), math.exp(0.3)], [1.0, math.exp(0.4)], [1.7]]
    s = window_spread(ratios)
    assert s is not None and s.df == 3 and s.sd == pytest.approx(math.sqrt(0.10 / 3), rel=1e-12)
    assert window_spread([[1.2], [0.9]]) is None


def test_run_only_interval_worked_by_hand() -> None:
    iv = paired_interval([0.1, 0.2, 0.3])
    # mean 0.2, SD 0.1 (df 2), half = 4.3026527 * 0.1 / sqrt(3) = 0.248414
    half = T975[2] * 0.1 / math.sqrt(3)
    assert iv.estimate == pytest.approx(math.exp(0.2), rel=1e-12)
    assert (iv.low, iv.high) == (pytest.approx(math.exp(0.2 - half), rel=1e-7),
                                 pytest.approx(math.exp(0.2 + half), rel=1e-7))
    assert (iv.df, iv.variance_source, iv.check, iv.triplets, iv.level) == (2, "run", None, 3, LEVEL)
    assert iv.per_triplet == pytest.approx((math.exp(0.1), math.exp(0.2), math.exp(0.3)))
    assert iv.half_width == pytest.approx(math.exp(half) - 1.0, rel=1e-7)
    assert iv.bounded and iv.covers_one


def test_pooled_interval_worked_by_hand() -> None:
    cal = Spread(0.12, 4)
    iv = paired_interval([0.1, 0.2, 0.3], cal)
    # F = (0.1 / 0.12)^2 = 0.694, not larger; pooled variance (2 * 0.01 + 4 * 0.0144) / 6 = 0.012933, df 6
    sd = math.sqrt((2 * 0.01 + 4 * 0.0144) / 6)
    half = T975[6] * sd / math.sqrt(3)
    assert (iv.variance_source, iv.df) == ("pooled", 6)
    assert iv.sd == pytest.approx(sd, rel=1e-12)
    assert iv.low == pytest.approx(math.exp(0.2 - half), rel=1e-7)
    assert iv.high == pytest.approx(math.exp(0.2 + half), rel=1e-7)
    assert iv.check is not None and not iv.check.larger
    assert iv.check.f == pytest.approx((0.1 / 0.12) ** 2, rel=1e-12)
    assert iv.check.p_value == pytest.approx(sps.f.sf((0.1 / 0.12) ** 2, 2, 4), rel=1e-12)
    assert "consistent with" in iv.check.words


def test_the_spread_check_falls_back_to_the_runs_own_spread_when_it_is_larger() -> None:
    cal = Spread(0.05, 4)
    iv = paired_interval([0.0, 0.5, 1.0], cal)  # run SD 0.5: F = 100
    assert (iv.variance_source, iv.df) == ("run", 2)
    assert iv.sd == pytest.approx(0.5, rel=1e-12)
    assert iv.check is not None and iv.check.larger and iv.check.f == pytest.approx(100.0)
    assert iv.check.p_value == pytest.approx(sps.f.sf(100.0, 2, 4), rel=1e-12)
    assert "larger than" in iv.check.words
    assert iv.high == pytest.approx(math.exp(0.5 + T975[2] * 0.5 / math.sqrt(3)), rel=1e-7)
    # the boundary is the F distribution's 95% point at (2, 4) df: just above it falls back, just below it pools
    f_crit = float(sps.f.ppf(0.95, 2, 4))
    for factor, larger in ((1.001, True), (0.999, False)):
        run = Spread(0.05 * math.sqrt(f_crit * factor), 2)
        assert spread_check(run, cal).larger is larger
    # a calibration of zero spread: any spread of the run is larger
    assert spread_check(Spread(0.01, 2), Spread(0.0, 4)).larger
    assert not spread_check(Spread(0.0, 2), Spread(0.0, 4)).larger


def test_one_triplet_with_and_without_a_calibration() -> None:
    bare = paired_interval([0.3])
    assert (bare.low, bare.high, bare.sd, bare.df, bare.variance_source) == (0.0, math.inf, None, 0, "none")
    assert not bare.bounded and bare.covers_one and bare.half_width == math.inf
    assert bare.triplets_for_target is None and bare.estimate == pytest.approx(math.exp(0.3))
    iv = paired_interval([0.3], Spread(0.1, 4))
    half = T975[4] * 0.1  # 0.277645
    assert (iv.variance_source, iv.df, iv.check) == ("calibration", 4, None)
    assert iv.low == pytest.approx(math.exp(0.3 - half), rel=1e-7) and iv.low > 1.0
    assert iv.high == pytest.approx(math.exp(0.3 + half), rel=1e-7)
    # a calibration without df is no calibration
    assert paired_interval([0.3], Spread(0.1, 0)).variance_source == "none"
    with pytest.raises(ValueError, match="at least one triplet"):
        paired_interval([])


def test_triplets_needed_counts_the_calibrations_df() -> None:
    # sd 0.05, calibration df 4, goal log(1.05) = 0.048790: K = 5 gives t(0.975, 8) * 0.05 / sqrt(5) = 0.05157,
    # K = 6 gives t(0.975, 9) = 2.2621572 * 0.05 / sqrt(6) = 0.04618
    assert triplets_needed(0.05, 4) == 6
    assert triplets_needed(0.0, 4) == 1 and triplets_needed(0.0) == 2
    assert triplets_needed(50.0) is None
    # the interval passes the calibration's df: pooled run of K = 2 at sd 0.05 with calibration df 4 -> 6
    iv = paired_interval([0.0, 0.05 * math.sqrt(2)], Spread(0.05, 4))
    assert iv.variance_source == "pooled" and iv.sd == pytest.approx(0.05) and iv.triplets_for_target == 6


def test_a_planted_outlier_triplet_is_named_and_clean_triplets_are_not() -> None:
    rng = np.random.default_rng(11)
    clean = list(rng.normal(0.0, 0.05, size=6))
    assert outlier_triplets(clean) == [] and outlier_triplets(clean, Spread(0.05, 4)) == []
    planted = [*clean[:3], 0.6, *clean[3:]]
    found = outlier_triplets(planted, Spread(0.05, 4))
    assert [o.triplet for o in found] == [3] and found[0].window is None and found[0].z > 5
    assert [o.triplet for o in outlier_triplets(planted)] == [3]
    assert outlier_triplets([0.1]) == [] and outlier_triplets([0.1, 0.9]) == []
    # family-wise: on clean draws at most about 5% of runs name a triplet
    flagged = sum(bool(outlier_triplets(list(rng.normal(0.0, 0.1, size=5)), Spread(0.1, 4))) for _ in range(400))
    assert flagged <= 0.05 * 400 + 3 * math.sqrt(0.05 * 0.95 * 400)


def test_a_planted_outlier_window_is_named_and_clean_windows_are_not() -> None:
    rng = np.random.default_rng(5)
    clean = [list(np.exp(rng.normal(0.0, 0.03, size=3))) for _ in range(8)]
    assert outlier_windows(clean) == [] and outlier_windows(clean, Spread(0.03, 12)) == []
    planted = [list(r) for r in clean]
    planted[2][1] *= 1.6
    found = outlier_windows(planted)
    assert [(o.triplet, o.window) for o in found] == [(2, 1)] and found[0].z > 0
    # the run's own window SD is inflated by the outlier it looks for: among 4 triplets the same window is masked,
    # and the calibration's window SD (given) names it. Residuals are taken about the triplet's own d, which holds
    # the outlier, so a large one pushes the triplet's other windows out too; it has the largest |z| of them
    assert outlier_windows(planted[:4]) == []
    big = outlier_windows(planted[:4], Spread(0.03, 12))
    assert {o.triplet for o in big} == {2} and max(big, key=lambda o: abs(o.z)).window == 1
    mild = [list(r) for r in clean[:4]]
    mild[2][1] *= 1.2  # z about 5 for the window, 2.5 for its neighbours: only it is named
    assert [(o.triplet, o.window) for o in outlier_windows(mild, Spread(0.03, 12))] == [(2, 1)]
    assert outlier_windows(planted, Spread(1.0, 12)) == []
    assert outlier_windows([[1.1], [0.9]]) == []


def test_variance_for_says_where_the_sd_comes_from() -> None:
    assert variance_for([0.1], None) == (None, "none", None)
    assert variance_for([0.1], Spread(0.2, 3))[1] == "calibration"
    assert variance_for([0.1, 0.2], None)[1] == "run"
    assert variance_for([0.1, 0.2], Spread(0.2, 3))[1] == "pooled"


# Invariants (hypothesis)

# spreads up to 0.15 on the log scale (the hosts measured: 0.11-0.2); wider ones only slow triplets_needed
d_lists = st.lists(st.floats(-0.3, 0.3), min_size=1, max_size=6)
calibrations = st.one_of(st.none(), st.builds(Spread, st.floats(0.001, 0.15), st.integers(1, 20)))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(d=d_lists, cal=calibrations)
def test_the_interval_contains_its_estimate(d: list[float], cal: Spread | None) -> None:
    iv = paired_interval(d, cal)
    assert iv.low <= iv.estimate * (1 + 1e-12) and iv.estimate <= iv.high * (1 + 1e-12)
    assert iv.bounded == (len(d) >= 2 or cal is not None)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(d=d_lists, cal=calibrations)
def test_swapping_the_roles_inverts_the_interval(d: list[float], cal: Spread | None) -> None:
    iv = paired_interval(d, cal)
    sw = paired_interval([-x for x in d], cal)
    assert sw.estimate == pytest.approx(1.0 / iv.estimate, rel=1e-9)
    if iv.bounded:
        assert sw.low == pytest.approx(1.0 / iv.high, rel=1e-9)
        assert sw.high == pytest.approx(1.0 / iv.low, rel=1e-9)
    else:
        assert (sw.low, sw.high) == (0.0, math.inf)


def _ratios(times: np.ndarray) -> list[list[float]]:
    """Window ratios of each triplet through the owner's definition (windows.speedup); times[t, role, step]."""
    out = []
    for trip in times:
        sp = speedup({role: list(trip[i]) for i, role in enumerate("ACB")}, steps=16, warmup=10, window=2,
                     drift_bound=0.02)
        out.append([w.ratio for w in sp.windows])
    return out


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 4), scale=st.floats(1e-3, 1e3), calibrated=st.booleans())
def test_multiplying_every_launch_time_by_a_constant_changes_nothing(seed: int, k: int, scale: float,
                                                                     calibrated: bool) -> None:
    rng = np.random.default_rng(seed)
    times = 0.3 * np.exp(rng.normal(0.0, 0.1, size=(k, 3, 1)) + rng.normal(0.0, 0.1, size=(k, 3, 16)))
    cal = Spread(0.1, 4) if calibrated else None
    ivs = []
    for t in (times, times * scale):
        ratios = _ratios(t)
        ivs.append((paired_interval([triplet_log_speedup(r) for r in ratios], cal), window_spread(ratios)))
    (a, wa), (b, wb) = ivs
    assert b.estimate == pytest.approx(a.estimate, rel=1e-9)
    assert b.low == pytest.approx(a.low, rel=1e-9) and (b.high == a.high or b.high == pytest.approx(a.high, rel=1e-9))
    assert (b.df, b.variance_source) == (a.df, a.variance_source)
    assert (wa is None) == (wb is None) and (wa is None or wb is None or wb.sd == pytest.approx(wa.sd, abs=1e-9))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(d=st.lists(st.floats(-0.3, 0.3), min_size=1, max_size=5), sd=st.floats(0.001, 0.15),
       df1=st.integers(1, 30), extra=st.integers(1, 30))
def test_more_calibration_df_never_widens_for_the_same_sd(d: list[float], sd: float, df1: int, extra: int) -> None:
    run = Spread.of(d)
    # the same SD as the run's own where the run has one, so that pooling cannot move the SD
    same = run.sd if run is not None and run.sd > 1e-6 else sd
    narrow = paired_interval(d, Spread(same, df1 + extra))
    wide = paired_interval(d, Spread(same, df1))
    assert narrow.variance_source == wide.variance_source != "run"
    assert narrow.half_width <= wide.half_width * (1 + 1e-12)


# Seeded Monte Carlo of coverage (2,000 runs per case)

RUNS = 2000
SIGMA = 0.02  # the t interval's coverage does not depend on the SD; a small one keeps triplets_needed quick


def _binomial_band(p: float, n: int) -> tuple[float, float]:
    """Four binomial SDs either side of the nominal rate: a correct interval fails this about 1 time in 16,000."""
    half = 4.0 * math.sqrt(p * (1 - p) / n)
    return p - half, p + half


@pytest.mark.parametrize(("k", "cal_triplets"), [(1, 5), (2, 5), (3, 0)])
def test_coverage_of_the_true_speedup_is_nominal(k: int, cal_triplets: int) -> None:
    """Per run: a fresh A/A calibration of `cal_triplets` triplets and K triplets of a 0.8x slowdown."""
    rng = np.random.default_rng(1000 * k + cal_triplets)
    truth = math.log(0.8)
    hits = 0
    for _ in range(RUNS):
        cal = Spread.of(list(rng.normal(0.0, SIGMA, size=cal_triplets))) if cal_triplets else None
        iv = paired_interval(list(rng.normal(truth, SIGMA, size=k)), cal)
        hits += iv.low <= 0.8 <= iv.high
    low, high = _binomial_band(LEVEL, RUNS)
    assert low <= hits / RUNS <= high, hits / RUNS


def test_a_normal_quantile_in_place_of_t_would_fail_the_coverage_check() -> None:
    """The Monte Carlo above can fail: with z = 1.96 instead of t(0.975, 2) the same runs cover about 81%."""
    rng = np.random.default_rng(3)
    d = rng.normal(0.0, SIGMA, size=(RUNS, 3))
    half = 1.959964 * d.std(axis=1, ddof=1) / math.sqrt(3)
    cover = float(np.mean(np.abs(d.mean(axis=1)) <= half))
    assert cover < _binomial_band(LEVEL, RUNS)[0], cover
