"""The speedup's confidence interval from one run's own launches, and its variance components (Kalibera & Jones).

Model (log window times): y[l, w] = mu[arm] + window[arm, w] + launch[l] + e[l, w]; the interval is Student's t.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

LEVEL = 0.95
METHOD = (
    "Student t interval for exp(mean log window time of the baseline launches - that of the candidate launches); "
    "one value per fresh launch (the mean over its windows of the log window time), launch-level variance pooled "
    "over both arms, df = launches - 2"
)
TARGET_HALF_WIDTH = 0.05  # the audit says how many triplets would bring the interval to +-5 %
MAX_TRIPLETS = 10_000


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """CDF of Student's t with df degrees of freedom."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """Inverse of t_cdf for 0.5 <= p < 1 (bisection to 1e-12)."""
    if not 0.5 <= p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df > 0, got p={p}, df={df}")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Interval:
    """The speedup (baseline time / candidate time: above 1 the candidate is faster) with its interval."""

    estimate: float
    low: float
    high: float
    level: float
    method: str
    df: int
    baseline_launches: int
    candidate_launches: int
    launch_sd: float  # SD of a launch's mean log window time (pooled within arms): launch + window noise
    launch_level_sd: float  # the launch component alone (Kalibera & Jones level 1), log scale
    window_level_sd: float  # within a launch, between windows (level 2), log scale
    half_width: float  # relative: (high / low) ** 0.5 - 1
    triplets_for_target: int | None  # triplets for a +-5 % interval at this run's launch SD (None: beyond reach)

    @property
    def covers_one(self) -> bool:
        return self.low <= 1.0 <= self.high


def _pooled(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """Pooled sample variance over groups and its degrees of freedom."""
    ss, df = 0.0, 0
    for g in groups:
        if len(g) >= 2:
            m = math.fsum(g) / len(g)
            ss += math.fsum((x - m) ** 2 for x in g)
            df += len(g) - 1
    return (ss / df if df else 0.0), df


def triplets_needed(launch_sd: float, level: float = LEVEL, target: float = TARGET_HALF_WIDTH) -> int | None:
    """Smallest K whose interval (2K baseline, K candidate launches) has relative half-width <= target."""
    goal = math.log1p(target)
    p = 0.5 + level / 2.0

    def half(k: int, q: float) -> float:
        return q * launch_sd * math.sqrt(1.0 / (2 * k) + 1.0 / k)

    for k in range(1, 101):
        if half(k, t_quantile(p, 3 * k - 2)) <= goal:
            return k
    # beyond 100 triplets t is the normal quantile to 3 digits: solve for K directly. z < t, so the normal
    # formula can name a K <= 100 that the exact loop above has already refused: the answer is then 101
    z = t_quantile(p, 1e9)
    k = max(101, math.ceil(1.5 * (z * launch_sd / goal) ** 2))
    return k if k <= MAX_TRIPLETS else None


def speedup_interval(
    windows: Mapping[str, Sequence[float]], arms: Mapping[str, str], level: float = LEVEL
) -> Interval:
    """windows: launch label -> its window times (s, the owner's windows, in window order); arms: label -> arm."""
    base = [lab for lab in windows if arms[lab] == "baseline"]
    cand = [lab for lab in windows if arms[lab] == "candidate"]
    if not base or not cand:
        raise ValueError("the interval needs at least one baseline and one candidate launch")
    n_w = {len(windows[lab]) for lab in windows}
    if len(n_w) != 1 or min(n_w) < 1:
        raise ValueError(f"every launch needs the same number of windows, got {sorted(n_w)}")
    nw = n_w.pop()
    logs = {lab: [math.log(x) for x in windows[lab]] for lab in windows}
    means = {lab: math.fsum(v) / nw for lab, v in logs.items()}
    mb = math.fsum(means[lab] for lab in base) / len(base)
    mc = math.fsum(means[lab] for lab in cand) / len(cand)
    delta = mb - mc
    var, df = _pooled([[means[lab] for lab in base], [means[lab] for lab in cand]])
    sd = math.sqrt(var)
    # window level: residuals after each launch's level and each arm's window profile (the same steps)
    resid: dict[str, list[list[float]]] = {"baseline": [], "candidate": []}
    for group, arm in ((base, "baseline"), (cand, "candidate")):
        profile = [math.fsum(logs[lab][w] - means[lab] for lab in group) / len(group) for w in range(nw)]
        for lab in group:
            resid[arm].append([logs[lab][w] - means[lab] - profile[w] for w in range(nw)])
    ss = math.fsum(r * r for rows in resid.values() for row in rows for r in row)
    w_df = sum(len(rows) * (nw - 1) - (nw - 1) for rows in resid.values() if len(rows) >= 1)
    window_var = ss / w_df if w_df > 0 else 0.0
    launch_var = max(0.0, var - window_var / nw)
    if df == 0:
        # one launch per arm: no spread to learn from; the interval is unbounded
        low, high = 0.0, math.inf
    else:
        half = t_quantile(0.5 + level / 2.0, df) * sd * math.sqrt(1.0 / len(base) + 1.0 / len(cand))
        low, high = math.exp(delta - half), math.exp(delta + half)
    rel_half = math.sqrt(high / low) - 1.0 if low > 0 and math.isfinite(high) else math.inf
    return Interval(
        estimate=math.exp(delta),
        low=low,
        high=high,
        level=level,
        method=METHOD,
        df=df,
        baseline_launches=len(base),
        candidate_launches=len(cand),
        launch_sd=sd,
        launch_level_sd=math.sqrt(launch_var),
        window_level_sd=math.sqrt(window_var),
        half_width=rel_half,
        triplets_for_target=triplets_needed(sd, level) if df > 0 else None,
    )
