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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import optimize
from scipy import stats as sps

from ledger.verdict.stats import OUTLIER_ALPHA, Outlier, Spread, pooled
from ledger.verdict.windows import Speedup
from protocol.plan import triplets

Y_FACTOR = 1.5  # E[var y] / sigma^2 for equal arms (1 + 1/2)
V_FACTOR = 2.0  # E[var v] / sigma^2
# var(u) / var(d) for baseline launches, u = mean_w log(A_w / B_w): launch and window terms enter u with weight
# 1 + 1 = 2 and an A/A triplet's d with 1/4 + 1/4 + 1 = 1.5 (baseline_outliers' rule for a calibration that records
# no A/B disagreements of its own launches)
AB_FACTOR = V_FACTOR / Y_FACTOR


def _ss(xs: Sequence[float]) -> tuple[float, int]:
    m = math.fsum(xs) / len(xs)
    return math.fsum((x - m) ** 2 for x in xs), len(xs) - 1


@dataclass(frozen=True)
class ArmSpread:
    """The within-launch step contrasts of one or more triplets (log scale), pooled over triplets: the candidate's
    (y, variance (lambda^2 + 1/2) sigma^2) and the baseline pair's (v, variance 2 sigma^2)."""

    candidate: Spread
    baseline: Spread

    @property
    def baseline_step(self) -> Spread:
        """The baseline arm's own step SD sigma from its A/B contrast alone."""
        return Spread(self.baseline.sd / math.sqrt(V_FACTOR), self.baseline.df)

    @property
    def aa_step(self) -> Spread:
        """For an A/A triplet (C is the baseline too): sigma from both contrasts, pooled."""
        return pooled(Spread(self.candidate.sd / math.sqrt(Y_FACTOR), self.candidate.df), self.baseline_step)


def arm_spread(times: Sequence[Mapping[str, Sequence[float]]]) -> ArmSpread | None:
    """times: per triplet, the step times (s) of roles A, C, B at the measured steps (the owner's windows, in step
    order). None when no triplet has two measured steps."""
    ss_y = ss_v = 0.0
    df = 0
    for t in times:
        a, c, b = t["A"], t["C"], t["B"]
        if not len(a) == len(b) == len(c) or len(a) < 2:
            continue
        la, lc, lb = ([math.log(x) for x in arm] for arm in (a, c, b))
        sy, n = _ss([z - (x + w) / 2.0 for x, z, w in zip(la, lc, lb, strict=True)])
        sv, _ = _ss([x - w for x, w in zip(la, lb, strict=True)])
        ss_y, ss_v, df = ss_y + sy, ss_v + sv, df + n
    if df == 0:
        return None
    return ArmSpread(Spread(math.sqrt(ss_y / df), df), Spread(math.sqrt(ss_v / df), df))


_NODES = 400  # Gauss-Legendre nodes over the F distribution's probability (c agrees with adaptive quadrature to 1e-5)


@lru_cache(maxsize=64)
def _f_nodes(d1: float, d2: float) -> tuple[np.ndarray, np.ndarray]:
    x, w = np.polynomial.legendre.leggauss(_NODES)
    u = (x + 1.0) / 2.0
    return np.sqrt(sps.f.ppf(u, d1, d2)), w / 2.0


@lru_cache(maxsize=512)
def critical_scaled(level: float, a: float, d1: float, d2: float) -> float:
    """c with P(|Z| <= c sqrt(Q F)) = level, Q = chi2_a / a, F ~ F(d1, d2) independent: the two-sided critical
    value of mean d / (s_cal sqrt(R)). One integral over F's probability u of the Student t probability of
    t_a = Z / sqrt(Q) (a smooth integrand on [0, 1])."""
    root_f, w = _f_nodes(d1, d2)

    def coverage(c: float) -> float:
        return float(np.sum(w * (2.0 * sps.t.cdf(c * root_f, a) - 1.0)))

    return float(optimize.brentq(lambda c: coverage(c) - level, 1e-6, 1e4, xtol=1e-12))


@lru_cache(maxsize=512)
def equivalent_df(level: float, a: float, d1: float, d2: float) -> float:
    """The Student t df whose two-sided critical value at `level` is critical_scaled's: the weight of the scaled
    calibration when it is pooled with a run's own triplets (K >= 2), and its df at K = 1 (same critical value)."""
    c = critical_scaled(level, a, d1, d2)
    if sps.t.ppf(0.5 + level / 2.0, 1e7) >= c:
        return 1e7
    return float(optimize.brentq(lambda v: float(sps.t.ppf(0.5 + level / 2.0, v)) - c, 0.05, 1e7, xtol=1e-10))


@dataclass(frozen=True)
class NoiseScale:
    """R = the candidate's within-launch step variance over the baseline's, as the variance factor of d."""

    ratio: float  # R (1: as noisy as the baseline)
    candidate: Spread  # y of the run's triplets
    baseline: Spread  # sigma: the calibration's A/A steps pooled with the run's A/B contrast
    calibration_df: int  # a: the df of the calibration's between-launch SD it scales

    @property
    def d1(self) -> int:
        return int(self.candidate.df)

    @property
    def d2(self) -> int:
        return int(self.baseline.df)

    @property
    def p_value(self) -> float:
        """One-sided: P(F(d1, d2) >= R) for a candidate as noisy as the baseline (small: noisier)."""
        return float(sps.f.sf(self.ratio, self.d1, self.d2))

    def df(self, level: float) -> float:
        return equivalent_df(round(level, 12), self.calibration_df, self.d1, self.d2)

    def scaled(self, calibration: Spread, level: float) -> Spread:
        """The calibration's between-launch SD times sqrt(R), with the equivalent df at this level."""
        return Spread(calibration.sd * math.sqrt(self.ratio), self.df(level))

    @property
    def words(self) -> str:
        cmp = ("noisier than" if self.p_value < 0.05 else "quieter than" if self.ratio < 1.0 else
               "as noisy as (within chance)")
        return (f"the candidate's steps are {cmp} the baseline's inside their launches: within-launch variance "
                f"ratio R = {self.ratio:.3g} (F({self.d1}, {self.d2}), one-sided p = {self.p_value:.3g}); the "
                f"calibration's spread, which measured the baseline only, is scaled by sqrt(R) = "
                f"{math.sqrt(self.ratio):.3g}")


def noise_scale(run: ArmSpread | None, calibration_step: Spread | None,
                calibration: Spread | None) -> NoiseScale | None:
    """None without a calibration that records the baseline's step spread (orch.calibration/2 written before issue
    34) or without step contrasts: the calibration is then used unscaled, as before."""
    if run is None or calibration_step is None or calibration is None or calibration_step.sd <= 0.0:
        return None
    base = pooled(calibration_step, run.baseline_step)
    ratio = run.candidate.sd**2 / (Y_FACTOR * base.sd**2)
    return NoiseScale(ratio, run.candidate, base, int(calibration.df))


def as_noise(scale: object) -> NoiseScale | None:
    """An interval's noise scale as this module's type (stats.py knows it only by its protocol, to import nothing
    of this module)."""
    return scale if isinstance(scale, NoiseScale) else None


def without_window(ratios: Sequence[float], window: int, calibration: Spread, window_sd: Spread,
                   scale: NoiseScale | None, level: float) -> tuple[float, float, float]:
    """(estimate, low, high) of one triplet's d without one window: the mean log ratio of the others, its variance
    the calibrated var(d) plus the window variance that dropping a window adds (sigma_w^2 (1/(n-1) - 1/n)), both
    scaled by R when given; the critical value is that of the scaled (or plain) calibration."""
    rest = [math.log(r) for i, r in enumerate(ratios) if i != window]
    n = len(ratios)
    mean = math.fsum(rest) / len(rest)
    var = calibration.sd**2 + window_sd.sd**2 * (1.0 / (n - 1) - 1.0 / n)
    if scale is not None:
        crit = critical_scaled(round(level, 12), scale.calibration_df, scale.d1, scale.d2)
        var *= scale.ratio
    else:
        crit = float(sps.t.ppf(0.5 + level / 2.0, calibration.df))
    half = crit * math.sqrt(var)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def pool_arms(arms: Sequence[ArmSpread | None]) -> ArmSpread | None:
    """The contrasts of several triplets pooled (df added)."""
    got = [a for a in arms if a is not None]
    if not got:
        return None
    return ArmSpread(pooled(*(a.candidate for a in got)), pooled(*(a.baseline for a in got)))


def triplet_arm_spread(sp: Speedup) -> ArmSpread | None:
    """One triplet's contrasts at the steps of the owner's windows (Speedup: ledger/verdict/windows.py)."""
    steps = {role: [s for w in sp.windows for s in getattr(w, f"{role.lower()}_steps")] for role in ("A", "C", "B")}
    return arm_spread([steps])


def aa_step_spread(speedup_doc: Mapping[str, Any]) -> Spread | None:
    """The baseline's step SD sigma of one A/A launch, from its audit's "speedup" block (both contrasts)."""
    windows = speedup_doc.get("windows") or []
    steps = {role: [float(s) for w in windows for s in w["step_times"][role]] for role in ("A", "C", "B")}
    arms = arm_spread([steps])
    return None if arms is None else arms.aa_step


@dataclass(frozen=True)
class NoiseEvidence:
    """What the noise check reads: each triplet's step contrasts (in launch order) and the calibration's baseline
    step spread (None: a calibration recorded before issue 34; no scaling, as before)."""

    triplets: tuple[ArmSpread | None, ...]
    calibration_step: Spread | None
    # the calibration's own A/B disagreements (the A/B launch check's reference); None: a calibration recorded before
    # they were (baseline_outliers then judges u against the calibration's SD of d)
    ab_reference: ABReference | None = None

    def scale(self, k: int, calibration: Spread | None) -> NoiseScale | None:
        """The scale at a look after the first k triplets."""
        return noise_scale(pool_arms(self.triplets[:k]), self.calibration_step, calibration)

    def without(self, triplet: int) -> NoiseEvidence:
        """The same evidence without one triplet's contrasts (the calibration's parts unchanged)."""
        return replace(self, triplets=tuple(a for j, a in enumerate(self.triplets) if j != triplet))


def ab_log_ratio(windows: Iterable[tuple[float, float]]) -> float:
    """u: the mean over the owner's windows of log(A_w / B_w), given each window's (A_w, B_w) times: how far a
    triplet's two baseline launches disagree (positive: A slower). The one definition of u, for a run's triplets
    (baseline_disagreement) and for the A/A launches of a calibration (aa_disagreement)."""
    logs = [math.log(a / b) for a, b in windows]
    return math.fsum(logs) / len(logs)


def baseline_disagreement(sp: Speedup) -> float:
    """u of one triplet (ab_log_ratio) from its owner's windows."""
    return ab_log_ratio((w.a, w.b) for w in sp.windows)


def aa_disagreement(speedup_doc: Mapping[str, Any]) -> float | None:
    """u of one A/A launch from its audit's "speedup" block (each window's summed A and B step times); None without
    windows."""
    windows = speedup_doc.get("windows") or []
    return ab_log_ratio((float(w["A"]), float(w["B"])) for w in windows) if windows else None


def launch_oriented(us: Sequence[float]) -> list[float]:
    """Each triplet's u signed as its first-launched baseline over its last: the plan launches odd triplets A C B and
    even ones B C A (protocol.plan.triplets), so a drift linear in launch position adds the same to every oriented
    u, and the same as to a calibration's A/A launches (each one triplet, launched A C B)."""
    return [u if t.order[0] == t.a else -u for u, t in zip(us, triplets(len(us), sequential=True), strict=True)]


@dataclass(frozen=True)
class ABReference:
    """The A/B disagreements u of a calibration's A/A launches (launched A C B, at the positions of a run's first
    triplet): the reference the A/B launch check judges a run's triplets against, drift and all."""

    us: tuple[float, ...]

    @classmethod
    def of(cls, us: Sequence[float] | None) -> ABReference | None:
        """None without at least two u's that differ (no spread to judge against)."""
        if us is None or len(us) < 2:
            return None
        ref = cls(tuple(float(u) for u in us))
        return ref if ref.sd > 0.0 else None

    @property
    def n(self) -> int:
        return len(self.us)

    @property
    def mean(self) -> float:
        return math.fsum(self.us) / self.n

    @property
    def sd(self) -> float:
        return math.sqrt(_ss(self.us)[0] / (self.n - 1))

    @property
    def df(self) -> int:
        return self.n - 1


def baseline_outliers(us: Sequence[float], calibration: Spread | None, alpha: float = OUTLIER_ALPHA,
                      reference: ABReference | None = None) -> list[Outlier]:
    """Triplets whose baseline launches A and B disagree beyond what the calibration's baseline launches show
    (issue 34); us in plan order (baseline_disagreement). Flagged when the two-sided p times K is below alpha
    (Bonferroni over the run's triplets).

    With the calibration's own A/B disagreements (reference): a prediction interval. A run's triplet and an A/A
    launch are the same baseline launches at the same positions, so without a launch outlier the run's oriented u
    (launch_oriented) and the n reference u's are iid, mean and drift included, and
    z = (u - mean_ref) / (s_ref sqrt(1 + 1/n)) ~ t(n - 1) for normal noise.

    Without it (a calibration recorded before it was): A and B are launches of the baseline, so u has mean 0 and
    variance AB_FACTOR * sigma_d^2 (sigma_d^2: the calibration's between-launch variance of d) and
    z = u / (s_cal sqrt(AB_FACTOR)) ~ t(calibration df). A drift linear in launch position cancels in d but not in u
    (A and B are two positions apart), so on a drifting host this older rule flags more often than alpha: it then
    refuses more, never accepts more."""
    if reference is not None:
        scale = reference.sd * math.sqrt(1.0 + 1.0 / reference.n)
        zs = [(u - reference.mean) / scale for u in launch_oriented(us)]
        df: float = reference.df
    elif calibration is None or calibration.df <= 0 or calibration.sd <= 0.0:
        return []
    else:
        zs = [u / (calibration.sd * math.sqrt(AB_FACTOR)) for u in us]
        df = calibration.df
    out = []
    for i, z in enumerate(zs):
        p = float(2.0 * sps.t.sf(abs(z), df))
        if p * len(us) < alpha:
            out.append(Outlier(i, None, z, p, df))
    return out
