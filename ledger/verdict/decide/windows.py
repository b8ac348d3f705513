"""Window statistics of one run (DESIGN.md section 5): step times, paired window ratios, A/B drift, headline.

Pure functions over step durations; the owner's definition is fixed here and nowhere else.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from protocol.errors import FailedError
from protocol.plan import ROLES
from protocol.results import StepRecord


@dataclass(frozen=True)
class WindowStats:
    """One window: the summed step times of each arm, their spread, the paired ratio and the A/B drift."""

    name: str
    steps: tuple[int, ...]
    a: float
    c: float
    b: float
    a_steps: tuple[float, ...]
    c_steps: tuple[float, ...]
    b_steps: tuple[float, ...]
    cv_a: float
    cv_c: float
    cv_b: float
    ratio: float
    drift: float
    noise: float  # the largest relative spread seen in this window: drift or a step-time CV
    within_noise: bool
    words: str


@dataclass(frozen=True)
class Speedup:
    windows: tuple[WindowStats, ...]
    headline: float
    headline_window: str
    max_drift: float
    drift_bound: float
    noisy: bool
    words: str


def window_steps(steps: int, warmup: int, window: int) -> list[tuple[int, ...]]:
    """Consecutive windows of `window` steps after `warmup`; 16/10/2 gives (10,11), (12,13), (14,15)."""
    if window < 1 or warmup < 0 or steps <= warmup:
        raise FailedError(f"measurement has no window: steps={steps}, warmup={warmup}, window={window}")
    if (steps - warmup) % window:
        # a partial window would compare fewer steps than the others; the protocol must not allow it
        raise FailedError(f"{steps - warmup} measured steps do not split into windows of {window}")
    return [tuple(range(s, s + window)) for s in range(warmup, steps, window)]


def step_times(ranks: Mapping[int, Sequence[StepRecord]], steps: int) -> list[float]:
    """Step time = max over ranks of the step's duration (probe work already excluded by the probe)."""
    if not ranks:
        raise FailedError("no step lines")
    times: list[float] = []
    for step in range(steps):
        durations = []
        for rank, records in sorted(ranks.items()):
            found = [r.duration_s for r in records if r.step == step]
            if len(found) != 1:
                raise FailedError(f"rank {rank}: {len(found)} step lines for step {step} (expected 1)")
            durations.append(found[0])
        times.append(max(durations))
    return times


def window_ratio(a: float, c: float, b: float) -> float:
    """ratio_w = mean(A_w, B_w) / C_w: above 1 means the candidate is faster."""
    return ((a + b) / 2.0) / c


def window_drift(a: float, b: float) -> float:
    """drift_w = |A_w - B_w| / mean(A_w, B_w): how far the two baseline launches disagree."""
    return abs(a - b) / ((a + b) / 2.0)


def coefficient_of_variation(xs: Sequence[float]) -> float:
    """Sample standard deviation over mean (0 for a single value): the spread of step times in a window."""
    if len(xs) < 2:
        return 0.0
    mean = statistics.fmean(xs)
    return statistics.stdev(xs) / mean if mean > 0 else math.inf


def _window(name: str, steps: tuple[int, ...], times: Mapping[str, Sequence[float]]) -> WindowStats:
    per_arm = {label: tuple(times[label][s] for s in steps) for label in ROLES}
    # fsum: the sum does not depend on the order of steps, so swapping arms cannot change a figure
    a, c, b = (math.fsum(per_arm[label]) for label in ROLES)
    for label, total in zip(ROLES, (a, c, b), strict=True):
        if not total > 0:
            raise FailedError(f"window {name}: arm {label} has non-positive time {total!r}")
    cv_a, cv_c, cv_b = (coefficient_of_variation(per_arm[label]) for label in ROLES)
    ratio = window_ratio(a, c, b)
    drift = window_drift(a, b)
    noise = max(drift, cv_a, cv_c, cv_b)
    within = abs(ratio - 1.0) <= noise
    if within:
        words = (
            f"{name}: ratio {ratio:.4f} is within noise "
            f"(|ratio-1| = {abs(ratio - 1.0):.4f} <= noise {noise:.4f}); no speed difference is shown"
        )
    else:
        faster = "faster" if ratio > 1.0 else "slower"
        words = f"{name}: candidate {faster} by {ratio:.4f}x, beyond the window's noise {noise:.4f}"
    return WindowStats(
        name=name,
        steps=steps,
        a=a,
        c=c,
        b=b,
        a_steps=per_arm["A"],
        c_steps=per_arm["C"],
        b_steps=per_arm["B"],
        cv_a=cv_a,
        cv_c=cv_c,
        cv_b=cv_b,
        ratio=ratio,
        drift=drift,
        noise=noise,
        within_noise=within,
        words=words,
    )


def speedup(
    times: Mapping[str, Sequence[float]],
    *,
    steps: int,
    warmup: int,
    window: int,
    drift_bound: float,
) -> Speedup:
    """Windows, per-window ratio and drift, headline = min ratio; noisy when any drift exceeds the bound."""
    for label in ROLES:
        if len(times.get(label, ())) != steps:
            raise FailedError(f"arm {label}: {len(times.get(label, ()))} step times, expected {steps}")
    stats = tuple(_window(f"w{i + 1}", ws, times) for i, ws in enumerate(window_steps(steps, warmup, window)))
    best = min(stats, key=lambda w: w.ratio)
    max_drift = max(w.drift for w in stats)
    noisy = max_drift > drift_bound
    if noisy:
        words = (
            f"noisy: A/B drift {max_drift:.4f} exceeds the bound {drift_bound:.4f}; "
            f"the headline {best.ratio:.4f}x is reported and bracketed by the interval, which carries that spread"
        )
    elif all(w.within_noise for w in stats):
        words = f"headline {best.ratio:.4f}x ({best.name}); every window's ratio is within its noise"
    elif best.within_noise:
        words = f"headline {best.ratio:.4f}x ({best.name}) is within that window's noise"
    else:
        words = f"headline {best.ratio:.4f}x ({best.name}), beyond the noise of every window that sets it"
    return Speedup(
        windows=stats,
        headline=best.ratio,
        headline_window=best.name,
        max_drift=max_drift,
        drift_bound=drift_bound,
        noisy=noisy,
        words=words,
    )
