"""A sequential stop (measurement.repeats: auto): add triplets until the interval excludes 1, is precise enough, or
the maximum is reached, with the error rate held under that optional stopping.

Method: group-sequential repeated confidence intervals (Jennison & Turnbull 1989; "Group Sequential Methods", 2000,
ch. 9) with a Lan-DeMets alpha-spending function of Pocock type, alpha(t) = alpha * ln(1 + (e - 1) t), t = k / K_max.
Guarantee: for normal per-triplet log speedups with known variance, the intervals of every look cover the true
speedup simultaneously with probability >= level, so a decision taken at whatever look the data make it errs with
probability <= 1 - level (stopping for precision or at the maximum only lowers it). The variance is estimated
(calibration pooled with the run), so each look's normal boundary is turned into a Student t multiplier of the same
nominal level at that look's df (the significance-level approach); bench/bench_verdict.py checks the error rate by
simulation under optional stopping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy import stats as sps

from ledger.verdict.noise import NoiseEvidence
from ledger.verdict.stats import LEVEL, TARGET_HALF_WIDTH, Interval, Spread, paired_interval

METHOD = (
    "group-sequential repeated confidence intervals (Jennison & Turnbull), Lan-DeMets alpha spending of Pocock "
    "type alpha*ln(1+(e-1)k/K_max), each look's boundary as a Student t multiplier at the look's df; simultaneous "
    "coverage over all looks, so the decision's error rate holds under the optional stop"
)
_NODES = 1201  # Simpson nodes over the continuation region (boundaries agree with published tables to 1e-3)


def pocock_spending(t: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending: the cumulative type I error allowed by information fraction t."""
    return alpha * math.log1p((math.e - 1.0) * min(max(t, 0.0), 1.0))


def _simpson(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w / 3.0


@lru_cache(maxsize=128)
def nominal_alphas(first: int, last: int, alpha: float) -> tuple[float, ...]:
    """Two-sided nominal significance level of each look k = first..last (one triplet more per look), such that a
    random walk of standard normal increments S_k crosses |S_k / sqrt(k)| >= c_k with cumulative probability
    pocock_spending(k / last) by look k. Numerical integration over the continuation region (Armitage, McPherson
    and Rowe's recursion; Jennison & Turnbull ch. 19), Simpson's rule on _NODES points."""
    if not 1 <= first <= last:
        raise ValueError(f"looks must satisfy 1 <= first <= last, got {first}, {last}")
    nodes: np.ndarray | None = None
    mass = np.zeros(0)  # Simpson weight x density of S_k at the nodes, continuation region only
    spent, out = 0.0, []
    for k in range(first, last + 1):
        root_k = math.sqrt(k)

        def crossing(c: float, x: np.ndarray | None = nodes, m: np.ndarray = mass, rk: float = root_k) -> float:
            b = c * rk
            if x is None:  # S_first ~ N(0, first)
                return float(2.0 * sps.norm.sf(b / math.sqrt(first)))
            return float(np.sum(m * (sps.norm.cdf(-b - x) + sps.norm.sf(b - x))))

        target = pocock_spending(k / last, alpha) - spent
        c = 0.0 if crossing(0.0) <= target else float(
            optimize.brentq(lambda v, t=target: crossing(v) - t, 0.0, 15.0, xtol=1e-12))
        spent += crossing(c)
        out.append(float(2.0 * sps.norm.sf(c)))
        b = c * root_k
        x = np.linspace(-b, b, _NODES)
        if nodes is None:
            dens = sps.norm.pdf(x, scale=math.sqrt(first))
        else:
            dens = (mass[None, :] * sps.norm.pdf(x[:, None] - nodes[None, :])).sum(axis=1)
        nodes, mass = x, _simpson(_NODES) * (x[1] - x[0]) * dens
    return tuple(out)


@dataclass(frozen=True)
class SequentialRule:
    """Add triplets until decided, precise or at the maximum."""

    max_triplets: int
    level: float = LEVEL
    target_half_width: float | None = TARGET_HALF_WIDTH

    def first_look(self, calibration: Spread | None) -> int:
        """With a calibration the first triplet can already be bounded; without one, the second."""
        return 1 if calibration is not None and calibration.df > 0 else min(2, self.max_triplets)

    def nominal_level(self, k: int, calibration: Spread | None) -> float:
        first = self.first_look(calibration)
        if k < first:
            return self.level
        looks = nominal_alphas(first, self.max_triplets, round(1.0 - self.level, 12))
        return 1.0 - looks[min(k, self.max_triplets) - first]

    def interval(self, d: Sequence[float], calibration: Spread | None,
                 noise: NoiseEvidence | None = None) -> Interval:
        """The repeated confidence interval at look K = len(d); noise: the calibration scaled by the candidate's
        within-launch noise of these K triplets (ledger/verdict/noise.py)."""
        scale = None if noise is None else noise.scale(len(d), calibration)
        return paired_interval(d, calibration, self.level, self.nominal_level(len(d), calibration), scale)

    def stop(self, iv: Interval) -> str | None:
        """Why the run stops after this look (decided | precise | maximum), or None to add a triplet."""
        if iv.bounded and not iv.covers_one:
            return "decided"
        if iv.bounded and self.target_half_width is not None and iv.half_width <= self.target_half_width:
            return "precise"
        if iv.triplets >= self.max_triplets:
            return "maximum"
        return None

    @property
    def words(self) -> str:
        target = (f", or its half-width is at most {self.target_half_width:.0%}"
                  if self.target_half_width is not None else "")
        return (f"add triplets until the {self.level:.0%} repeated interval excludes 1{target}, at most "
                f"{self.max_triplets} triplets ({METHOD})")
