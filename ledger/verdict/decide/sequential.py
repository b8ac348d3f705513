"""A sequential stop (measurement.repeats: auto): add triplets until the interval excludes 1, is precise enough, or
the maximum is reached, with the error rate held under that optional stopping.

Method: group-sequential repeated confidence intervals (Jennison & Turnbull 1989; "Group Sequential Methods", 2000,
ch. 9) with a Lan-DeMets alpha-spending function of Pocock type, alpha(t) = alpha * ln(1 + (e - 1) t), t = k / K_max.
Guarantee: for normal per-triplet log speedups with known variance, the intervals of every look cover the true
speedup simultaneously with probability >= level, so a decision taken at whatever look the data make it errs with
probability <= 1 - level (stopping for precision or at the maximum only lowers it). The variance is estimated
(calibration pooled with the run), so each look's normal boundary is turned into a Student t multiplier of the same
nominal level at that look's df (the significance-level approach). Without a calibration each look's spread is the
run's own (df 1 at the first look) and that approach errs above alpha (about 6 %): the boundaries then come from the
looks' exact joint law under normal d, in which the t statistics are pivots (t_alphas). bench/bench_verdict.py
checks the error rate by simulation under optional stopping.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

import ledger.verdict.decide.dist as dist
from ledger.verdict.decide.noise import NoiseEvidence
from ledger.verdict.decide.stats import LEVEL, TARGET_HALF_WIDTH, Interval, Spread, paired_interval

METHOD = (
    "group-sequential repeated confidence intervals (Jennison & Turnbull), Lan-DeMets alpha spending of Pocock "
    "type alpha*ln(1+(e-1)k/K_max), each look's boundary as a Student t multiplier at the look's df (without a "
    "calibration, boundaries that spend alpha under the looks' joint Student t law); simultaneous coverage over all "
    "looks, so the decision's error rate holds under the optional stop"
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
    from scipy.optimize import brentq  # here, not at the top: about 0.1 s of every orch start with no sequential stop

    nodes: np.ndarray | None = None
    mass = np.zeros(0)  # Simpson weight x density of S_k at the nodes, continuation region only
    spent, out = 0.0, []
    for k in range(first, last + 1):
        root_k = math.sqrt(k)

        def crossing(c: float, x: np.ndarray | None = nodes, m: np.ndarray = mass, rk: float = root_k) -> float:
            b = c * rk
            if x is None:  # S_first ~ N(0, first)
                return float(2.0 * dist.norm_sf(b / math.sqrt(first)))
            return float(np.sum(m * (dist.norm_cdf(-b - x) + dist.norm_sf(b - x))))

        target = pocock_spending(k / last, alpha) - spent
        c = 0.0 if crossing(0.0) <= target else float(
            brentq(lambda v, t=target: crossing(v) - t, 0.0, 15.0, xtol=1e-12))
        spent += crossing(c)
        out.append(float(2.0 * dist.norm_sf(c)))
        b = c * root_k
        x = np.linspace(-b, b, _NODES)
        if nodes is None:
            dens = dist.norm_pdf(x, scale=math.sqrt(first))
        else:
            dens = (mass[None, :] * dist.norm_pdf(x[:, None] - nodes[None, :])).sum(axis=1)
        nodes, mass = x, _simpson(_NODES) * (x[1] - x[0]) * dens
    return tuple(out)


_T_PATHS = 17  # 2^17 scrambled Sobol points: the t boundaries' crossing probabilities to about 1e-4
_T_SEED = 34  # the scrambling's seed: fixed, so that the launch and every later audit compute the same boundaries


@lru_cache(maxsize=32)
def t_alphas(first: int, last: int, alpha: float) -> tuple[float, ...]:
    """Two-sided nominal significance level of each look k = first..last (first >= 2) when each look's spread is the
    run's own (Student t at df k - 1): the boundaries c_k on |T_k|, T_k = sqrt(k) mean_k / s_k, such that iid normal
    d crosses by look k with probability pocock_spending(k / last), the looks' joint law included (T_k is a pivot:
    the joint law of T_first..T_last has no unknown parameter). The first look's c is the t law's own quantile; each
    later c_k is the order statistic of |T_k|, among the paths not yet crossed, that spends the look's increment,
    over the paths of iid standard normal increments at the points of a scrambled Sobol sequence of fixed seed
    (deterministic; scipy.stats.qmc). Nominal alpha_k = P(|t_{k-1}| > c_k). The known-variance recursion
    (nominal_alphas) credits the looks a correlation their own spreads do not have (at df 1 the first look crosses
    mostly on a small s, independently of the later looks): DESIGN.md section 5."""
    if not 2 <= first <= last:
        raise ValueError(f"t looks must satisfy 2 <= first <= last, got {first}, {last}")
    from scipy.stats import qmc  # here: scipy.stats' import is about 0.3 s more of every orch start (dist.py)

    z = dist.norm_ppf(qmc.Sobol(d=last, scramble=True, seed=_T_SEED).random_base2(_T_PATHS))
    n = z.shape[0]
    total, squares = np.cumsum(z, axis=1), np.cumsum(z * z, axis=1)
    alive = np.ones(n, dtype=bool)
    spent, out = 0, []
    for k in range(first, last + 1):
        mean = total[:, k - 1] / k
        sd = np.sqrt(np.maximum(squares[:, k - 1] - k * mean * mean, 0.0) / (k - 1))
        with np.errstate(divide="ignore"):
            t = np.abs(mean) * math.sqrt(k) / sd
        cross = round(pocock_spending(k / last, alpha) * n) - spent  # paths to cross at look k
        live = np.sort(t[alive])[::-1]
        if k == first:  # nothing crossed before: the t law itself
            c = float(dist.t_isf(pocock_spending(k / last, alpha) / 2.0, k - 1))
        elif cross <= 0:
            c = float(live[0]) if live.size else math.inf
        elif cross >= live.size:
            c = 0.0
        else:
            c = float((live[cross - 1] + live[cross]) / 2.0)
        crossed = alive & (t > c)
        spent += int(crossed.sum())
        alive &= ~crossed
        out.append(float(2.0 * dist.t_sf(c, k - 1)))
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
        """The nominal level of look k. With a usable calibration, the group-sequential boundary (nominal_alphas:
        the looks' correlation sqrt(j / k) credited, t multipliers at each look's df of at least the calibration's).
        Without one, each look's spread is the run's own (df k - 1, 1 at the first look) and a crossing there is
        driven by that spread as much as by the mean, so the correlation the recursion credits is not there: the
        boundaries come from the looks' exact joint law under normal d (t_alphas; DESIGN.md section 5)."""
        first = self.first_look(calibration)
        if k < first:
            return self.level
        alpha = round(1.0 - self.level, 12)
        calibrated = calibration is not None and calibration.df > 0
        looks = nominal_alphas(first, self.max_triplets, alpha) if calibrated or first < 2 else t_alphas(
            first, self.max_triplets, alpha)
        return 1.0 - looks[min(k, self.max_triplets) - first]

    def interval(self, d: Sequence[float], calibration: Spread | None,
                 noise: NoiseEvidence | None = None) -> Interval:
        """The repeated confidence interval at look K = len(d); noise: the calibration scaled by the candidate's
        within-launch noise of these K triplets (ledger/verdict/decide/noise.py)."""
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
