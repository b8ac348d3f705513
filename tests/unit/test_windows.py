"""Window statistics of DESIGN.md section 5: worked examples and invariants (hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.verdict.decide.windows import (
    coefficient_of_variation,
    speedup,
    step_times,
    window_drift,
    window_ratio,
    window_steps,
)
from protocol.errors import FailedError
from protocol.results import RngFingerprint, StepRecord

STEPS, WARMUP, WINDOW = 16, 10, 2
times_st = st.lists(st.floats(min_value=1e-3, max_value=10.0, allow_nan=False), min_size=STEPS, max_size=STEPS)


def _speedup(a: list[float], c: list[float], b: list[float], bound: float = 0.02):  # type: ignore[no-untyped-def]
    return speedup({"A": a, "C": c, "B": b}, steps=STEPS, warmup=WARMUP, window=WINDOW, drift_bound=bound)


def test_windows_of_the_owner_definition() -> None:
    assert window_steps(16, 10, 2) == [(10, 11), (12, 13), (14, 15)]
    with pytest.raises(FailedError):
        window_steps(15, 10, 2)  # a partial window is refused, never silently dropped


def test_worked_example() -> None:
    a = [1.0] * 16
    b = [1.0] * 16
    c = [0.5] * 16
    c[14] = 0.8  # w3 is the slowest window of the candidate: it sets the headline
    sp = _speedup(a, c, b)
    ratios = [w.ratio for w in sp.windows]
    assert ratios[:2] == [2.0, 2.0]
    assert math.isclose(ratios[2], 2.0 / 1.3)
    assert sp.headline == min(ratios) and sp.headline_window == "w3"
    assert sp.max_drift == 0.0 and not sp.noisy
    assert sp.windows[0].a == 2.0 and sp.windows[0].c_steps == (0.5, 0.5)


def test_drift_above_bound_is_noisy() -> None:
    a = [1.0] * 16
    b = [1.0] * 16
    b[12] = 1.1  # w2: A=2.0, B=2.1 -> drift 0.1/2.05
    sp = _speedup(a, [1.0] * 16, b)
    assert sp.noisy and math.isclose(sp.windows[1].drift, 0.1 / 2.05)
    assert "noisy" in sp.words
    assert not _speedup(a, [1.0] * 16, b, bound=0.05).noisy


def test_within_noise_words() -> None:
    a = [1.0] * 16
    b = [1.0] * 16
    b[10] = 1.02  # w1 drift ~0.0099
    c = [1.0] * 16
    c[10] = 0.995  # ratio ~1.0075 > 1 but |ratio-1| < drift? 0.0075 vs 0.0099 -> within noise
    w1 = _speedup(a, c, b).windows[0]
    assert w1.within_noise and "within noise" in w1.words
    c2 = [0.5] * 16
    w1b = _speedup(a, c2, b).windows[0]
    assert not w1b.within_noise and "faster" in w1b.words


def test_cv() -> None:
    assert coefficient_of_variation([2.0]) == 0.0
    assert coefficient_of_variation([1.0, 1.0]) == 0.0
    assert math.isclose(coefficient_of_variation([1.0, 3.0]), math.sqrt(2.0) / 2.0)


def _line(rank: int, step: int, d: float) -> StepRecord:
    return StepRecord(rank=rank, world_size=2, step=step, duration_s=d, probe_s=0.0, lr=[1e-6],
                      rng=RngFingerprint(cpu="0" * 64))


def test_step_time_is_max_over_ranks() -> None:
    ranks = {0: [_line(0, s, 1.0) for s in range(3)], 1: [_line(1, s, 1.0 + s) for s in range(3)]}
    assert step_times(ranks, 3) == [1.0, 2.0, 3.0]
    ranks[1] = ranks[1][:2]
    with pytest.raises(FailedError, match="rank 1: 0 step lines for step 2"):
        step_times(ranks, 3)


@settings(max_examples=60, deadline=None)
@given(a=times_st, c=times_st, b=times_st)
def test_swapping_baselines_changes_nothing(a: list[float], c: list[float], b: list[float]) -> None:
    x, y = _speedup(a, c, b), _speedup(b, c, a)
    assert [w.ratio for w in x.windows] == [w.ratio for w in y.windows]
    assert [w.drift for w in x.windows] == [w.drift for w in y.windows]
    assert x.headline == y.headline and x.noisy == y.noisy


@settings(max_examples=60, deadline=None)
@given(a=times_st, c=times_st, b=times_st, k=st.floats(min_value=1e-2, max_value=1e2))
def test_scaling_all_times_keeps_ratios(a: list[float], c: list[float], b: list[float], k: float) -> None:
    x = _speedup(a, c, b)
    y = _speedup([t * k for t in a], [t * k for t in c], [t * k for t in b])
    for wx, wy in zip(x.windows, y.windows, strict=True):
        assert math.isclose(wx.ratio, wy.ratio, rel_tol=1e-9)
        assert math.isclose(wx.drift, wy.drift, rel_tol=1e-9, abs_tol=1e-12)


@settings(max_examples=60, deadline=None)
@given(a=times_st)
def test_identical_arms(a: list[float]) -> None:
    sp = _speedup(a, list(a), list(a))
    assert all(w.drift == 0.0 for w in sp.windows)
    assert all(math.isclose(w.ratio, 1.0, rel_tol=1e-15) for w in sp.windows)
    assert not sp.noisy and all(w.within_noise for w in sp.windows)


@settings(max_examples=60, deadline=None)
@given(a=times_st, c=times_st, b=times_st)
def test_headline_is_min_and_definitions(a: list[float], c: list[float], b: list[float]) -> None:
    sp = _speedup(a, c, b)
    assert sp.headline == min(w.ratio for w in sp.windows)
    for w in sp.windows:
        assert math.isclose(w.ratio, window_ratio(w.a, w.c, w.b))
        assert math.isclose(w.drift, window_drift(w.a, w.b))
        assert w.drift >= 0.0 and w.ratio > 0.0
    assert sp.noisy == any(w.drift > 0.02 for w in sp.windows)


def test_ratio_is_the_mean_of_the_two_baselines_over_the_candidate() -> None:
    # A != B, so mean, max and min of the baselines all differ: (2 + 3) / 2 / 1 = 2.5 (max gives 3, min 2)
    assert window_ratio(2.0, 1.0, 3.0) == 2.5
    assert window_drift(2.0, 3.0) == 0.4  # |2 - 3| / 2.5
    sp = _speedup([1.0] * 16, [0.5] * 16, [1.5] * 16, bound=0.5)
    w1 = sp.windows[0]
    assert (w1.a, w1.c, w1.b) == (2.0, 1.0, 3.0)
    assert [w.ratio for w in sp.windows] == [2.5, 2.5, 2.5] and sp.headline == 2.5
    assert sp.max_drift == 0.4 and not sp.noisy  # 0.4 <= 0.5
    assert _speedup([1.0] * 16, [0.5] * 16, [1.5] * 16, bound=0.39).noisy


def _flat_but_w1(a: tuple[float, float], c: tuple[float, float], b: tuple[float, float]):  # type: ignore[no-untyped-def]
    """Window w1 (steps 10, 11) with the given step times; every other step 2.0 s in every arm."""
    arms = {}
    for label, pair in (("A", a), ("C", c), ("B", b)):
        times = [2.0] * 16
        times[10], times[11] = pair
        arms[label] = times
    return _speedup(arms["A"], arms["C"], arms["B"], bound=0.5).windows[0]


@pytest.mark.parametrize("spread_in", ["A", "B"])
def test_the_spread_of_a_baseline_is_part_of_the_noise(spread_in: str) -> None:
    # the baseline's steps are 1 s and 3 s: sum 4, CV = stdev(1, 3) / 2 = sqrt(2) / 2 = 0.7071; the other
    # baseline 2 s + 2 s (sum 4, no drift), the candidate 1.5 s + 1.5 s: ratio 4 / 3, |ratio - 1| = 0.3333
    spread, flat = (1.0, 3.0), (2.0, 2.0)
    w = _flat_but_w1(spread if spread_in == "A" else flat, (1.5, 1.5), spread if spread_in == "B" else flat)
    assert w.drift == 0.0 and math.isclose(w.ratio, 4.0 / 3.0)
    assert math.isclose(w.noise, math.sqrt(2.0) / 2.0)
    assert w.within_noise and "within noise" in w.words  # only that baseline's spread makes it noise


def test_the_spread_of_the_candidate_is_part_of_the_noise() -> None:
    # candidate 1 s + 2 s: sum 3, CV = stdev(1, 2) / 1.5 = 0.4714; baselines 2 + 2: ratio 4 / 3, |ratio - 1| = 0.3333
    w = _flat_but_w1((2.0, 2.0), (1.0, 2.0), (2.0, 2.0))
    assert math.isclose(w.noise, (math.sqrt(2.0) / 2.0) / 1.5) and w.within_noise
    # with no spread anywhere the same ratio is a speed difference
    assert not _flat_but_w1((2.0, 2.0), (1.5, 1.5), (2.0, 2.0)).within_noise


def test_window_boundaries_of_the_measurement() -> None:
    assert window_steps(16, 10, 1) == [(s,) for s in range(10, 16)]  # a window of one step is a window
    assert window_steps(4, 0, 2) == [(0, 1), (2, 3)]  # no warm-up is allowed
    assert window_steps(16, 10, 3) == [(10, 11, 12), (13, 14, 15)]  # 6 measured steps in windows of 3
    assert window_steps(11, 10, 1) == [(10,)]
    for steps, warmup, window in ((16, 10, 0), (16, -1, 2), (10, 10, 1), (9, 10, 1)):
        with pytest.raises(FailedError) as err:
            window_steps(steps, warmup, window)
        assert err.value.message == f"measurement has no window: steps={steps}, warmup={warmup}, window={window}"
    with pytest.raises(FailedError) as err:
        window_steps(16, 11, 2)
    assert err.value.message == "5 measured steps do not split into windows of 2"


def test_refusals_name_what_is_missing() -> None:
    with pytest.raises(FailedError) as err:
        step_times({}, 3)
    assert err.value.message == "no step lines"
    with pytest.raises(FailedError) as err:
        _speedup([1.0] * 16, [1.0] * 15, [1.0] * 16)
    assert err.value.message == "arm C: 15 step times, expected 16"
    c = [1.0] * 16
    c[10] = c[11] = 0.0  # a candidate window that took no time cannot be a ratio
    with pytest.raises(FailedError) as err:
        _speedup([1.0] * 16, c, [1.0] * 16)
    assert err.value.message == "window w1: arm C has non-positive time 0.0"


def test_cv_of_no_time_is_infinite() -> None:
    assert coefficient_of_variation([0.0, 0.0]) == math.inf
    assert coefficient_of_variation([-1.0, -3.0]) == math.inf


def test_the_drift_alone_can_make_a_window_noise() -> None:
    # A 1 + 1 = 2, B 1.1 + 1.1 = 2.2 (no spread in any arm), C 1 + 1 = 2: ratio 2.1 / 2 = 1.05,
    # drift 0.2 / 2.1 = 0.0952 > |ratio - 1| = 0.05
    w = _flat_but_w1((1.0, 1.0), (1.0, 1.0), (1.1, 1.1))
    assert (w.cv_a, w.cv_c, w.cv_b) == (0.0, 0.0, 0.0)
    assert math.isclose(w.ratio, 1.05) and math.isclose(w.noise, 0.2 / 2.1) and w.within_noise
    assert w.words == ("w1: ratio 1.0500 is within noise (|ratio-1| = 0.0500 <= noise 0.0952); "
                       "no speed difference is shown")


def test_every_figure_of_a_window_is_kept() -> None:
    w = _flat_but_w1((1.0, 3.0), (1.0, 2.0), (2.0, 4.0))
    assert w.name == "w1" and w.steps == (10, 11)
    assert (w.a_steps, w.c_steps, w.b_steps) == ((1.0, 3.0), (1.0, 2.0), (2.0, 4.0))
    assert (w.a, w.c, w.b) == (4.0, 3.0, 6.0)
    assert math.isclose(w.cv_a, math.sqrt(2.0) / 2.0)  # stdev(1, 3) / 2
    assert math.isclose(w.cv_c, (math.sqrt(2.0) / 2.0) / 1.5)  # stdev(1, 2) / 1.5
    assert math.isclose(w.cv_b, math.sqrt(2.0) / 3.0)  # stdev(2, 4) / 3
    assert math.isclose(w.ratio, 5.0 / 3.0) and math.isclose(w.drift, 0.4)  # mean(4, 6) / 3; |4 - 6| / 5


def test_faster_and_slower_are_said_as_such() -> None:
    faster = _flat_but_w1((2.0, 2.0), (1.0, 1.0), (2.0, 2.0))
    assert faster.words == "w1: candidate faster by 2.0000x, beyond the window's noise 0.0000"
    slower = _flat_but_w1((2.0, 2.0), (4.0, 4.0), (2.0, 2.0))
    assert slower.words == "w1: candidate slower by 0.5000x, beyond the window's noise 0.0000"
    # a ratio of exactly 1 with no noise at all is within it (|1 - 1| = 0 <= 0)
    same = _flat_but_w1((2.0, 2.0), (2.0, 2.0), (2.0, 2.0))
    assert same.within_noise and same.words.startswith("w1: ratio 1.0000 is within noise")


def test_the_headline_is_said_for_each_case() -> None:
    # every window 2x faster and quiet: beyond the noise
    sp = _speedup([1.0] * 16, [0.5] * 16, [1.0] * 16)
    assert sp.words == "headline 2.0000x (w1), beyond the noise of every window that sets it"
    assert sp.drift_bound == 0.02 and sp.max_drift == 0.0
    # every window equal: each ratio 1 within its noise
    sp = _speedup([1.0] * 16, [1.0] * 16, [1.0] * 16)
    assert sp.words == "headline 1.0000x (w1); every window's ratio is within its noise"
    # w2 is the slowest candidate window (ratio 2 / 1.9 = 1.0526) and within its noise (C spread 0.9, 1.0:
    # cv = 0.0707 / 0.95 = 0.0744); the other windows are 2x and quiet
    c = [0.5] * 16
    c[12], c[13] = 0.9, 1.0
    sp = _speedup([1.0] * 16, c, [1.0] * 16)
    assert sp.headline_window == "w2" and math.isclose(sp.headline, 2.0 / 1.9)
    assert sp.words == "headline 1.0526x (w2) is within that window's noise"


def test_a_drift_equal_to_the_bound_is_not_noisy() -> None:
    # w: A 2, B 3: drift |2 - 3| / 2.5 = 0.4 exactly
    assert not _speedup([1.0] * 16, [0.5] * 16, [1.5] * 16, bound=0.4).noisy
    assert _speedup([1.0] * 16, [0.5] * 16, [1.5] * 16, bound=0.4).words == (
        "headline 2.5000x (w1), beyond the noise of every window that sets it")
    noisy = _speedup([1.0] * 16, [0.5] * 16, [1.5] * 16, bound=0.3)
    assert noisy.words == ("noisy: A/B drift 0.4000 exceeds the bound 0.3000; "
                           "the headline 2.5000x is reported and bracketed by the interval, which carries that spread")
