"""The speedup interval: Student t against known quantiles, and its coverage on synthetic launches (hypothesis).

Synthetic step times follow the host's noise as measured: a random speed per fresh launch and per step.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.verdict.decision import decide, launch_windows
from ledger.verdict.stats import METHOD as METHOD_WORDS
from ledger.verdict.stats import speedup_interval, t_cdf, t_quantile, triplets_needed
from protocol.plan import arm_of, launch_labels

SIMS = 300


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [(0.975, 1, 12.7062047), (0.975, 2, 4.3026527), (0.975, 7, 2.3646243), (0.95, 4, 2.1318468),
     (0.975, 30, 2.0422725), (0.975, 1e9, 1.9599640)],
)
def test_t_quantile_matches_published_tables(p: float, df: float, expected: float) -> None:
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-6)
    assert t_cdf(expected, df) == pytest.approx(p, abs=1e-7)


def _simulate(rng: np.random.Generator, repeats: int, ratio: float, launch_sd: float, step_sd: float,
              base: np.ndarray) -> dict[str, list[float]]:
    """Step times of every launch of a run: per-step workload, a launch effect, step noise; C = base / ratio."""
    times = {}
    for label in launch_labels(repeats):
        scale = 1.0 / ratio if arm_of(label) == "candidate" else 1.0
        noise = np.exp(rng.normal(0.0, launch_sd) + rng.normal(0.0, step_sd, size=16))
        times[label] = list(base * scale * noise)
    return times


def _coverage(seed: int, repeats: int, ratio: float, launch_sd: float, step_sd: float) -> float:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.05, 1.0, size=16)  # each step's own work, the same for every launch (same seeds)
    hits = 0
    for _ in range(SIMS):
        times = _simulate(rng, repeats, ratio, launch_sd, step_sd, base)
        wins = launch_windows(times, steps=16, warmup=10, window=2)
        iv = speedup_interval(wins, {lab: arm_of(lab) for lab in wins})
        hits += iv.low <= ratio <= iv.high
    return hits / SIMS


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    seed=st.integers(0, 2**32 - 1),
    repeats=st.integers(1, 4),
    ratio=st.sampled_from([0.8, 1.0, 1.25, 3.9]),
    launch_sd=st.floats(0.0, 0.25),
    step_sd=st.floats(0.005, 0.25),
)
def test_coverage_is_close_to_nominal(seed: int, repeats: int, ratio: float, launch_sd: float, step_sd: float) -> None:
    cover = _coverage(seed, repeats, ratio, launch_sd, step_sd)
    # 95% nominal; 300 simulations have a binomial SD of 1.3 points: 4 SDs either side
    assert 0.90 <= cover <= 1.0, cover
    assert cover <= 0.995 or repeats == 1 or launch_sd < 0.02, cover


@settings(max_examples=8, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32 - 1), repeats=st.integers(1, 3), launch_sd=st.floats(0.05, 0.3))
def test_a_null_is_covered_and_gives_no_difference(seed: int, repeats: int, launch_sd: float) -> None:
    """The host's measured null spread (launch SD up to ~0.3): a null run says `no difference shown`."""
    cover = _coverage(seed, repeats, 1.0, launch_sd, 0.15)
    assert cover >= 0.90, cover
    rng = np.random.default_rng(seed)
    times = _simulate(rng, repeats, 1.0, launch_sd, 0.15, rng.uniform(0.05, 1.0, size=16))
    wins = launch_windows(times, steps=16, warmup=10, window=2)
    iv = speedup_interval(wins, {lab: arm_of(lab) for lab in wins})
    verdict, direction, _ = decide(True, iv)
    assert (verdict, direction) == (("no difference shown", None) if iv.covers_one else ("accepted", direction))


def test_a_known_slowdown_is_excluded_from_one_and_covers_its_ratio() -> None:
    """The bench's known slowdown: the candidate sleeps a quarter of the step (ratio 0.8), host noise 5%."""
    rng = np.random.default_rng(7)
    times = _simulate(rng, 3, 0.8, 0.05, 0.05, rng.uniform(0.05, 1.0, size=16))
    wins = launch_windows(times, steps=16, warmup=10, window=2)
    iv = speedup_interval(wins, {lab: arm_of(lab) for lab in wins})
    assert iv.low <= 0.8 <= iv.high < 1.0
    assert decide(True, iv)[:2] == ("accepted", "slower")
    assert decide(False, iv)[0] == "not exact"


def test_one_triplet_interval_is_wide_and_variance_components_are_separated() -> None:
    rng = np.random.default_rng(3)
    wide = []
    for _ in range(50):
        times = _simulate(rng, 1, 1.0, 0.1, 0.02, np.full(16, 0.5))
        wins = launch_windows(times, steps=16, warmup=10, window=2)
        iv = speedup_interval(wins, {lab: arm_of(lab) for lab in wins})
        wide.append(iv.half_width)
        assert iv.df == 1 and iv.baseline_launches == 2 and iv.candidate_launches == 1
    many = []
    for _ in range(50):
        times = _simulate(rng, 8, 1.0, 0.1, 0.02, np.full(16, 0.5))
        wins = launch_windows(times, steps=16, warmup=10, window=2)
        iv = speedup_interval(wins, {lab: arm_of(lab) for lab in wins})
        many.append(iv.half_width)
        # window level: two steps of SD 0.02 each -> about 0.014 per window; launch level 0.1
        assert 0.05 < iv.launch_level_sd < 0.2 and 0.005 < iv.window_level_sd < 0.03
    assert np.median(wide) > 4 * np.median(many)


def test_triplets_needed_for_five_percent() -> None:
    # at a launch SD of 0.02 two triplets suffice; at 0.2 (the lent H200's eager baseline) about a hundred
    assert triplets_needed(0.02) == 2
    k = triplets_needed(0.2)
    assert k is not None and 90 <= k <= 110
    sd = 0.2
    half = t_quantile(0.975, 3 * k - 2) * sd * math.sqrt(1 / (2 * k) + 1 / k)
    assert half <= math.log(1.05) < t_quantile(0.975, 3 * k - 5) * sd * math.sqrt(1 / (2 * (k - 1)) + 1 / (k - 1))
    assert triplets_needed(0.0) == 1 and triplets_needed(5.0) is None


# Hand-worked cases (issue 18: each pins a rule with values computed on paper, not by the code under test).
# Student t quantiles from the published tables: t(0.975, 1) = 12.7062047, t(0.975, 4) = 2.7764451,
# t(0.975, 6) = 2.4469119, t(0.975, 7) = 2.3646243, t(0.975, 8) = 2.3060041; z(0.975) = 1.9599640.


def test_t_cdf_is_the_closed_form_of_one_and_two_degrees_of_freedom() -> None:
    # df 1 (Cauchy): 1/2 + atan(t)/pi; df 2: 1/2 + t / (2 sqrt(2 + t^2)). Below |t| ~ 1 the incomplete beta takes
    # its other branch (x = df / (df + t^2) above (a + 1) / (a + b + 2)), which the table test never reaches.
    for t in (0.1, 0.3, 0.5, 1.0, 2.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-9)
        assert t_cdf(-t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, abs=1e-9)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-9)
    assert t_cdf(-1.0, 1) == pytest.approx(0.25, abs=1e-12)
    assert t_cdf(0.5, 2) == pytest.approx(2 / 3, abs=1e-12)  # 1/2 + 0.5 / (2 * 1.5)
    # the quantile at 0.75: tan(pi/4) = 1 for df 1; t^2 = 0.25 (2 + t^2), t = sqrt(2/3) for df 2
    assert t_quantile(0.75, 1) == pytest.approx(1.0, abs=1e-9)
    assert t_quantile(0.75, 2) == pytest.approx(math.sqrt(2 / 3), abs=1e-9)


def test_t_cdf_at_zero_is_one_half_and_at_infinity_is_zero_or_one() -> None:
    for df in (1, 2, 7, 30):
        assert t_cdf(0.0, df) == 0.5
        assert t_cdf(math.inf, df) == 1.0
        assert t_cdf(-math.inf, df) == 0.0


def test_triplets_needed_at_hand_worked_spreads() -> None:
    goal = math.log(1.05)  # 0.0487902
    # K triplets: half = t(0.975, 3K - 2) * sd * sqrt(1/(2K) + 1/K). At sd 0.022: K = 2 gives
    # 2.7764451 * 0.022 * sqrt(0.75) = 0.0529 > goal; K = 3 gives 2.3646243 * 0.022 * sqrt(0.5) = 0.0368 <= goal.
    # (With df 3K + 2 or 4K - 2, K = 2 would pass: 2.3060041 or 2.4469119 * 0.022 * 0.866 < goal.)
    assert triplets_needed(0.022) == 3
    # beyond 100 triplets: K = ceil(1.5 * (z * sd / goal)^2); sd 0.5: 1.5 * (1.959964 * 0.5 / 0.0487902)^2 = 605.2
    assert triplets_needed(0.5) == 606
    # the cap: 10 000 triplets is still within reach, one more is not
    edge = goal / 1.9599640 * math.sqrt(9999.5 / 1.5)
    assert triplets_needed(edge) == 10_000
    assert triplets_needed(goal / 1.9599640 * math.sqrt(10_000.5 / 1.5)) is None
    # just past the loop's last K: at sd 0.2028, K = 100 gives t(0.975, 298) = 1.96793 * 0.2028 * sqrt(1.5/100) =
    # 0.048879 > goal and K = 101 gives 1.96788 * 0.2028 * sqrt(1.5/101) = 0.048636 <= goal: 101, although the
    # normal formula alone says ceil(1.5 * (1.959964 * 0.2028 / 0.0487902)^2) = ceil(99.55) = 100
    assert triplets_needed(0.2028) == 101
    # at the 90% level z = 1.6448536 and t(0.95, ~100) = 1.660: K = 35 at sd sqrt(0.02) (K = 34 gives 0.0493)
    assert triplets_needed(math.sqrt(0.02), 0.90) == 35


def test_the_interval_of_a_hand_worked_run() -> None:
    """Log window times A1 [0.3, 0.1], B1 [0, 0], C1 [-0.5, -0.7]; every figure below is worked out by hand."""
    wins = {"A1": [math.exp(0.3), math.exp(0.1)], "C1": [math.exp(-0.5), math.exp(-0.7)], "B1": [1.0, 1.0]}
    iv = speedup_interval(wins, {"A1": "baseline", "B1": "baseline", "C1": "candidate"})
    # launch means: A1 0.2, B1 0.0, C1 -0.6; baseline mean 0.1, so the log speedup is 0.1 - (-0.6) = 0.7
    assert iv.estimate == pytest.approx(math.exp(0.7), rel=1e-12)
    assert iv.method == METHOD_WORDS
    # pooled launch variance: ((0.2 - 0.1)^2 + (0.0 - 0.1)^2) / 1 = 0.02 (the lone candidate adds no df)
    assert (iv.df, iv.baseline_launches, iv.candidate_launches) == (1, 2, 1)
    assert iv.launch_sd == pytest.approx(math.sqrt(0.02), rel=1e-12)
    # window level: the baseline profile is (+0.05, -0.05), residuals A1 (0.05, -0.05), B1 (-0.05, 0.05), C1 (0, 0);
    # ss = 4 * 0.0025 = 0.01 over df 2 * 1 - 1 = 1 (the lone candidate: 1 * 1 - 1 = 0)
    assert iv.window_level_sd == pytest.approx(0.1, rel=1e-9)
    # launch level: 0.02 - 0.01 / 2 windows = 0.015
    assert iv.launch_level_sd == pytest.approx(math.sqrt(0.015), rel=1e-9)
    half = 12.7062047 * math.sqrt(0.02) * math.sqrt(1 / 2 + 1 / 1)  # 2.20078
    assert iv.low == pytest.approx(math.exp(0.7 - half), rel=1e-6)
    assert iv.high == pytest.approx(math.exp(0.7 + half), rel=1e-6)
    assert iv.half_width == pytest.approx(math.exp(half) - 1.0, rel=1e-6)
    # triplets for +-5% at sd sqrt(0.02): K = 49 gives t(0.975, 145) = 1.9765 * 0.14142 * sqrt(1.5/49) = 0.04891 > goal,
    # K = 50 gives 1.9762 * 0.14142 * sqrt(1.5/50) = 0.04841 <= goal
    assert iv.triplets_for_target == 50
    # at the 90% level (t(0.95, 1) = 6.3137515) the triplets are counted at that level too (35, see above)
    iv90 = speedup_interval(wins, {"A1": "baseline", "B1": "baseline", "C1": "candidate"}, level=0.90)
    assert iv90.high == pytest.approx(math.exp(0.7 + 6.3137515 * math.sqrt(0.03)), rel=1e-6)
    assert iv90.triplets_for_target == 35


def test_one_launch_per_arm_gives_an_unbounded_interval_and_no_spread() -> None:
    iv = speedup_interval({"A1": [2.0, 2.0], "C1": [1.0, 1.0]}, {"A1": "baseline", "C1": "candidate"})
    assert iv.estimate == pytest.approx(2.0, rel=1e-12)
    assert (iv.df, iv.low, iv.high, iv.half_width, iv.triplets_for_target) == (0, 0.0, math.inf, math.inf, None)
    assert (iv.launch_sd, iv.launch_level_sd, iv.window_level_sd) == (0.0, 0.0, 0.0)
    assert iv.covers_one


def test_one_window_per_launch_is_enough() -> None:
    # baselines both 2 s, candidate 1 s: no spread at all, so the interval is the point 2
    iv = speedup_interval({"A1": [2.0], "C1": [1.0], "B1": [2.0]},
                          {"A1": "baseline", "B1": "baseline", "C1": "candidate"})
    assert (iv.estimate, iv.low, iv.high) == pytest.approx((2.0, 2.0, 2.0), rel=1e-12)
    assert (iv.df, iv.window_level_sd) == (1, 0.0)


def test_the_interval_refuses_a_run_without_both_arms_or_with_uneven_windows() -> None:
    arms = {"A1": "baseline", "B1": "baseline", "C1": "candidate"}
    with pytest.raises(ValueError, match=r"^the interval needs at least one baseline and one candidate launch$"):
        speedup_interval({"A1": [1.0], "B1": [1.0]}, arms)
    with pytest.raises(ValueError, match=r"^the interval needs at least one baseline and one candidate launch$"):
        speedup_interval({"C1": [1.0]}, arms)
    with pytest.raises(ValueError, match=r"^every launch needs the same number of windows, got \[1, 2\]$"):
        speedup_interval({"A1": [1.0, 1.0], "C1": [1.0], "B1": [1.0, 1.0]}, arms)
