"""The candidate's own noise, seen inside one triplet (issue 34): arm-by-arm step contrasts, the F ratio of the
candidate's within-launch variance to the baseline's, and the calibration scaled by it, with its exact critical value.

Model (DESIGN.md section 5, "The candidate's noise"): the log time of arm X at measured step s of launch L is
mu_s + a_L + e_Ls, with launch effect SD lambda_X * tau and step noise SD lambda_X * sigma (the scale model: a
noisier candidate is noisier at every level by one factor lambda). Per triplet and measured step:
  y_s = log C_s - (log A_s + log B_s) / 2     residual variance about its mean: (lambda^2 + 1/2) sigma^2
  v_s = log A_s - log B_s                     residual variance about its mean: 2 sigma^2
The workload mu_s, the launch effects and any drift linear in launch position cancel in both; y and v are
uncorrelated (Cov = -sigma^2/2 + sigma^2/2 = 0), so independent for normal noise. An A/A calibration (C is the
baseline) measures sigma^2 from both. R = s_y^2 / (1.5 sigma_hat^2) estimates theta = (lambda^2 + 1/2) / 1.5, the
factor by which the variance of a triplet's d exceeds the calibrated one, and R / theta ~ F(d1, d2). So
  T = mean d / (s_cal sqrt(R)) ~ Z / sqrt(Q * F),  Q = chi2_a / a, F ~ F(d1, d2)
whatever lambda is: the critical value of that pivot (critical_scaled) gives a K = 1 interval with exact coverage
for a candidate noisier or quieter than the baseline, with no threshold and nothing tuned.

The candidate's effect may differ from step to step (StepProfile): a change that saves or adds a fixed time per
step moves the log time of a short step more than that of a long one, so on a workload whose steps alternate in
length (r3-mini: 0.83 s and 1.80 s) y_s alternates too, and read as noise it scaled a steady 5% slowdown's interval
by sqrt(10) (docs/validation/gpu_bound_h100x1_adf16d8.json). With the calibration's baseline step profile x_s (the
mean log time of each measured step over its A/A launches: launches other than the run's, so independent of its
noise), y_s is taken about a line in x_s instead of about its mean: mean y_s = alpha + beta x_s, one df fewer, and
R / theta ~ F(d1, d2) still holds exactly (d1 = K (S - 2) for S measured steps), given the profile.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

import ledger.verdict.decide.dist as dist
from ledger.verdict.decide.stats import OUTLIER_ALPHA, Outlier, Spread, StepProfile, pooled
from ledger.verdict.decide.windows import Speedup

Y_FACTOR = 1.5  # E[var y] / sigma^2 for equal arms (1 + 1/2)
V_FACTOR = 2.0  # E[var v] / sigma^2
# var(u) / var(d) for baseline launches, u = mean_w log(A_w / B_w): launch and window terms enter u with weight
# 1 + 1 = 2 and an A/A triplet's d with 1/4 + 1/4 + 1 = 1.5 (baseline_outliers)
AB_FACTOR = V_FACTOR / Y_FACTOR


def _ss(xs: Sequence[float]) -> tuple[float, int]:
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs), len(xs) - 1


def _line_ss(ys: Sequence[float], xs: Sequence[float]) -> tuple[float, int]:
    """Residual sum of squares and df of ys about their least-squares line in xs."""
    n = len(ys)
    mx, my = math.fsum(xs) / n, math.fsum(ys) / n
    sxx = math.fsum((x - mx) ** 2 for x in xs)
    slope = math.fsum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return math.fsum((y - my - slope * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True)), n - 2


@dataclass(frozen=True)
class ArmSpread:
    """The within-launch step contrasts of one or more triplets (log scale), pooled over triplets: the candidate's
    (y, variance (lambda^2 + 1/2) sigma^2) and the baseline pair's (v, variance 2 sigma^2)."""

    candidate: Spread
    baseline: Spread
    fitted: bool = False  # y was taken about a line in the calibration's step profile (StepProfile), every triplet

    @property
    def baseline_step(self) -> Spread:
        """The baseline arm's own step SD sigma from its A/B contrast alone."""
        return Spread(self.baseline.sd / math.sqrt(V_FACTOR), self.baseline.df)

    @property
    def aa_step(self) -> Spread:
        """For an A/A triplet (C is the baseline too): sigma from both contrasts, pooled."""
        return pooled(Spread(self.candidate.sd / math.sqrt(Y_FACTOR), self.candidate.df), self.baseline_step)


def arm_spread(times: Sequence[Mapping[str, Sequence[float]]],
               profile: Sequence[float] | None = None) -> ArmSpread | None:
    """times: per triplet, the step times (s) of roles A, C, B at the measured steps (the owner's windows, in step
    order). profile: the calibration's log step times at those steps (StepProfile, already checked to fit them):
    y is then taken about a line in it (one df fewer a triplet). None when no triplet has two measured steps."""
    ss_y = ss_v = 0.0
    df_y = df_v = 0
    for t in times:
        a, c, b = t["A"], t["C"], t["B"]
        if not len(a) == len(b) == len(c) or len(a) < 2:
            continue
        la, lc, lb = ([math.log(x) for x in arm] for arm in (a, c, b))
        y = [z - (x + w) / 2.0 for x, z, w in zip(la, lc, lb, strict=True)]
        sy, ny = _ss(y) if profile is None else _line_ss(y, profile)
        sv, nv = _ss([x - w for x, w in zip(la, lb, strict=True)])
        ss_y, ss_v, df_y, df_v = ss_y + sy, ss_v + sv, df_y + ny, df_v + nv
    if df_y <= 0:
        return None
    return ArmSpread(Spread(math.sqrt(ss_y / df_y), df_y), Spread(math.sqrt(ss_v / df_v), df_v), profile is not None)


_NODES = 400  # Gauss-Legendre nodes over the F distribution's probability (c agrees with adaptive quadrature to 1e-5)


@lru_cache(maxsize=64)
def _f_nodes(d1: float, d2: float) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(_NODES)
    u = (x + 1.0) / 2.0
    return np.sqrt(dist.f_ppf(u, d1, d2)), w / 2.0


# variance factors theta of a candidate's d (scale model) at which critical_scaled's coverage is also held, beside the
# limit theta -> inf; at theta <= the floor it holds at every c above the calibration's own t (see critical_scaled)
_THETAS = (0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 10.0, 15.0, 25.0, 50.0, 100.0, 1000.0)


def _solve(level: float, a: float, g: np.ndarray, w: np.ndarray) -> float:
    """c with sum_i w_i P(|t_a| <= c g_i) = level."""
    from scipy.optimize import brentq  # here, not at the top: about 0.1 s of every orch start with no calibration

    def coverage(c: float) -> float:
        return float(np.sum(w * (2.0 * dist.t_cdf(c * g, a) - 1.0)))

    return float(brentq(lambda c: coverage(c) - level, 1e-6, 1e4, xtol=1e-12))


@lru_cache(maxsize=512)
def ratio_floor(level: float, a: float, d1: float, d2: float) -> float:
    """The least R the calibration is scaled by (issue 52): (t_a / c)^2, c the scaled pivot's critical value. So a
    one-triplet interval is never narrower than the calibration's own, t_a s_cal: a steadier candidate's steps may
    not narrow what is mostly between-launch variance."""
    root_f, w = _f_nodes(d1, d2)
    return (float(dist.t_ppf(0.5 + level / 2.0, a)) / _solve(level, a, root_f, w)) ** 2


@lru_cache(maxsize=512)
def critical_scaled(level: float, a: float, d1: float, d2: float, n: int = 0) -> float:
    """The two-sided critical value c of T = (mean d - m) / (s_cal sqrt(max(R, r0) + 1/n)), m the calibration's A/A
    mean of n launches (n = 0: none, m = 0), r0 = ratio_floor, with R / theta ~ F(d1, d2) and s_cal^2 / sigma^2 ~
    chi2_a / a: the smallest c whose coverage is `level` at every theta. T = Z / sqrt(Q g), g = (max(theta F, r0) +
    1/n) / (theta + 1/n): one integral over F's probability of the Student t probability of t_a = Z / sqrt(Q) (a
    smooth integrand on [0, 1]). theta -> inf gives g = F (issue 34's exact pivot, whose c defines r0); without n
    that limit is the least coverage (g >= F at every theta); with n, c is the largest over _THETAS and the limit.
    At theta <= r0, g >= 1 and the coverage is at least t_a's at c >= t_a's quantile."""
    root_f, w = _f_nodes(d1, d2)
    c = _solve(level, a, root_f, w)
    if n > 0:
        r0 = (float(dist.t_ppf(0.5 + level / 2.0, a)) / c) ** 2
        f = root_f**2
        for theta in _THETAS:
            c = max(c, _solve(level, a, np.sqrt((np.maximum(theta * f, r0) + 1.0 / n) / (theta + 1.0 / n)), w))
    return c


@lru_cache(maxsize=512)
def equivalent_df(level: float, a: float, d1: float, d2: float, n: int = 0) -> float:
    """The Student t df whose two-sided critical value at `level` is critical_scaled's: the weight of the scaled
    calibration when it is pooled with a run's own triplets (K >= 2), and its df at K = 1 (same critical value)."""
    from scipy.optimize import brentq

    c = critical_scaled(level, a, d1, d2, n)
    if dist.t_ppf(0.5 + level / 2.0, 1e7) >= c:
        return 1e7
    return float(brentq(lambda v: float(dist.t_ppf(0.5 + level / 2.0, v)) - c, 0.05, 1e7, xtol=1e-10))


@dataclass(frozen=True)
class NoiseScale:
    """R = the candidate's within-launch step variance over the baseline's, as the variance factor of d."""

    ratio: float  # R (1: as noisy as the baseline)
    candidate: Spread  # y of the run's triplets
    baseline: Spread  # sigma: the calibration's A/A steps pooled with the run's A/B contrast
    calibration_df: int  # a: the df of the calibration's between-launch SD it scales
    launches: int = 0  # n of the calibration's A/A mean subtracted from d (stats.Position; 0: none)
    fitted: bool = False  # the candidate's y about a line in the calibration's step profile (StepProfile)

    def applied(self, level: float) -> float:
        """max(R, r0), the factor the calibration's variance is scaled by (issue 52; r0 = ratio_floor, about 0.61 for
        a 5-launch calibration at 95 %). R sees only the steps inside a launch; most of the variance of d is between
        launches, which a steadier candidate (CUDA graphs: R about 1/3) need not have less of. So its steps may widen
        the interval, never narrow it below the calibration's own one-triplet interval t_a s_cal."""
        return max(self.ratio, ratio_floor(round(level, 12), self.calibration_df, self.d1, self.d2))

    @property
    def d1(self) -> int:
        return int(self.candidate.df)

    @property
    def d2(self) -> int:
        return int(self.baseline.df)

    @property
    def p_value(self) -> float:
        """One-sided: P(F(d1, d2) >= R) for a candidate as noisy as the baseline (small: noisier)."""
        return float(dist.f_sf(self.ratio, self.d1, self.d2))

    def df(self, level: float) -> float:
        return equivalent_df(round(level, 12), self.calibration_df, self.d1, self.d2, self.launches)

    def critical(self, level: float) -> float:
        return critical_scaled(round(level, 12), self.calibration_df, self.d1, self.d2, self.launches)

    def scaled(self, calibration: Spread, level: float) -> Spread:
        """The calibration's between-launch SD times sqrt(max(R, r0)), with the equivalent df at this level."""
        return calibration.scaled_by(math.sqrt(self.applied(level)), self.df(level))

    @property
    def words(self) -> str:
        cmp = ("noisier than" if self.p_value < 0.05 else "quieter than" if self.ratio < 1.0 else
               "as noisy as (within chance)")
        fit = (" about a line in the baseline's step profile (an effect that differs between short and long steps "
               "is not noise)" if self.fitted else "")
        return (f"the candidate's steps are {cmp} the baseline's inside their launches: within-launch variance "
                f"ratio R = {self.ratio:.3g}{fit} (F({self.d1}, {self.d2}), one-sided p = {self.p_value:.3g}); the "
                f"calibration's spread, which measured the baseline only, is scaled by sqrt(R) = "
                f"{math.sqrt(self.ratio):.3g}, never below the calibration's own one-triplet interval (steadier steps "
                "cannot narrow the spread between launches)")


def noise_scale(run: ArmSpread | None, calibration_step: Spread | None,
                calibration: Spread | None) -> NoiseScale | None:
    """None without a calibration that records the baseline's step spread (orch.calibration/2 written before issue
    34) or without step contrasts: the calibration is then used unscaled, as before."""
    if run is None or calibration_step is None or calibration is None or calibration_step.sd <= 0.0:
        return None
    base = pooled(calibration_step, run.baseline_step)
    ratio = run.candidate.sd**2 / (Y_FACTOR * base.sd**2)
    launches = calibration.position.launches if calibration.position is not None else 0
    return NoiseScale(ratio, run.candidate, base, int(calibration.df), launches, run.fitted)


def as_noise(scale: object) -> NoiseScale | None:
    """An interval's noise scale as this module's type (stats.py knows it only by its protocol, to import nothing
    of this module)."""
    return scale if isinstance(scale, NoiseScale) else None


def without_window(ratios: Sequence[float], window: int, calibration: Spread, window_sd: Spread,
                   scale: NoiseScale | None, level: float) -> tuple[float, float, float]:
    """(estimate, low, high) of one triplet's d without one window: the mean log ratio of the others (less the
    calibration's position effect), its variance the calibrated var(d) plus the window variance that dropping a
    window adds (sigma_w^2 (1/(n-1) - 1/n)), both scaled by max(R, 1) when given, plus the carried variance of the
    position effect; the critical value is that of the scaled (or plain) calibration."""
    rest = [math.log(r) for i, r in enumerate(ratios) if i != window]
    n = len(ratios)
    mean = math.fsum(rest) / len(rest)
    var = calibration.sd**2 + window_sd.sd**2 * (1.0 / (n - 1) - 1.0 / n)
    if scale is not None:
        crit = scale.critical(level)
        var *= scale.applied(level)
    else:
        crit = float(dist.t_ppf(0.5 + level / 2.0, calibration.df))
    position = calibration.position
    if position is not None and position.launches > 0:
        mean -= position.d
        var += calibration.sd**2 / position.launches
    half = crit * math.sqrt(var)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def pool_arms(arms: Sequence[ArmSpread | None]) -> ArmSpread | None:
    """The contrasts of several triplets pooled (df added)."""
    got = [a for a in arms if a is not None]
    if not got:
        return None
    return ArmSpread(pooled(*(a.candidate for a in got)), pooled(*(a.baseline for a in got)),
                     all(a.fitted for a in got))


def triplet_arm_spread(sp: Speedup, profile: StepProfile | None = None) -> ArmSpread | None:
    """One triplet's contrasts at the steps of the owner's windows (Speedup: ledger/verdict/decide/windows.py),
    the candidate's taken about a line in the calibration's step profile when it fits these steps."""
    steps = {role: [s for w in sp.windows for s in getattr(w, f"{role.lower()}_steps")] for role in ("A", "C", "B")}
    measured = [i for w in sp.windows for i in w.steps]
    line = profile.log_times if profile is not None and profile.fits(measured) else None
    return arm_spread([steps], line)


def _aa_step_times(speedup_doc: Mapping[str, Any]) -> dict[str, list[float]]:
    """Each role's step times at the measured steps, in step order, from an audit's "speedup" block."""
    windows = speedup_doc.get("windows") or []
    return {role: [float(s) for w in windows for s in w["step_times"][role]] for role in ("A", "C", "B")}


def aa_step_spread(speedup_doc: Mapping[str, Any]) -> Spread | None:
    """The baseline's step SD sigma of one A/A launch, from its audit's "speedup" block (both contrasts)."""
    arms = arm_spread([_aa_step_times(speedup_doc)])
    return None if arms is None else arms.aa_step


def aa_step_profile(speedup_doc: Mapping[str, Any]) -> tuple[tuple[int, ...], list[float]] | None:
    """One A/A launch's measured steps and the mean over its three baseline arms of each one's log time (the
    calibration averages them over its launches: StepProfile); None without windows."""
    steps = tuple(int(i) for w in speedup_doc.get("windows") or [] for i in w.get("steps") or [])
    times = _aa_step_times(speedup_doc)
    logs = [math.fsum(math.log(s) for s in trio) / 3.0 for trio in zip(*times.values(), strict=True)]
    return (steps, logs) if steps and len(steps) == len(logs) else None


@dataclass(frozen=True)
class NoiseEvidence:
    """What the noise check reads: each triplet's step contrasts (in launch order) and the calibration's baseline
    step spread (None: a calibration recorded before issue 34; no scaling, as before)."""

    triplets: tuple[ArmSpread | None, ...]
    calibration_step: Spread | None

    def scale(self, k: int, calibration: Spread | None) -> NoiseScale | None:
        """The scale at a look after the first k triplets."""
        return noise_scale(pool_arms(self.triplets[:k]), self.calibration_step, calibration)


def baseline_disagreement(sp: Speedup) -> float:
    """u of one triplet: the mean over the owner's windows of log(A_w / B_w), how far its two baseline launches
    disagree (positive: A slower)."""
    return math.fsum(math.log(w.a / w.b) for w in sp.windows) / len(sp.windows)


def ab_expected(i: int, calibration: Spread) -> float:
    """The u the calibration's launch positions give triplet i (0-based) of the plan: its A/A mean u for the order
    A C B (odd triplets), minus it for B C A (even ones: A and B swap positions); 0 without a position effect."""
    position = calibration.position
    if position is None or position.launches <= 0:
        return 0.0
    return position.u if i % 2 == 0 else -position.u


def baseline_outliers(us: Sequence[float], calibration: Spread | None,
                      alpha: float = OUTLIER_ALPHA) -> list[Outlier]:
    """Triplets whose baseline launches A and B disagree beyond the calibrated between-launch spread (issue 34).

    A and B are launches of the baseline, the arm the A/A calibration measured, so without a launch outlier u has
    mean 0 and variance AB_FACTOR * sigma_d^2 (sigma_d^2: the calibration's between-launch variance of d), and
    z = u / (s_cal sqrt(AB_FACTOR)) ~ t(calibration df) for normal noise (u and s_cal come from different
    launches). Flagged when the two-sided p times K is below alpha (Bonferroni over the run's triplets). A drift
    linear in launch position cancels in d but not in u (A and B are two positions apart), so a drifting host is
    flagged more often than alpha: the check then refuses more, it never accepts more. A calibration with a position
    effect (issue 52) centres u on the A/A mean u of its order (ab_expected), whose variance (1/n of u's) is carried:
    z = (u - m_u) / (s_cal sqrt(AB_FACTOR (1 + 1/n)))."""
    if calibration is None or calibration.df <= 0 or calibration.sd <= 0.0:
        return []
    position = calibration.position
    carried = 1.0 / position.launches if position is not None and position.launches > 0 else 0.0
    scale = calibration.sd * math.sqrt(AB_FACTOR * (1.0 + carried))
    out = []
    for i, u in enumerate(us):
        z = (u - ab_expected(i, calibration)) / scale
        p = float(2.0 * dist.t_sf(abs(z), calibration.df))
        if p * len(us) < alpha:
            out.append(Outlier(i, None, z, p, calibration.df))
    return out
