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
