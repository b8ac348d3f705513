"""The verdict's statistics (DESIGN.md section 5): the fresh A -> C -> B triplet is the unit of replication.

Per triplet, the paired log speedup d = mean over windows of log(ratio_w), ratio_w = mean(A_w, B_w) / C_w (the
owner's window ratio); over K triplets a Student t interval of exp(mean d), its variance pooled with the host's A/A
calibration (Kalibera & Jones: measure the variance where it lives, once per platform, then plan repetitions).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import ledger.verdict.decide.dist as dist

LEVEL = 0.95
TARGET_HALF_WIDTH = 0.05  # the audit says how many triplets would bring the interval to +-5 %
MAX_TRIPLETS = 10_000
SPREAD_ALPHA = 0.05  # the run's spread is "larger than calibrated" when the one-sided F test rejects at this level
OUTLIER_ALPHA = 0.05  # family-wise (Bonferroni over the triplets, or over the windows) for the outlier diagnostics
METHOD = (
    "paired: one value per fresh A -> C -> B triplet, d = mean over its windows of log(mean(A_w, B_w) / C_w); "
    "Student t interval of exp(mean d) over the triplets, the between-triplet SD pooled with this host's A/A "
    "calibration of the same protocol or baseline workload (df added) unless the run's own spread is larger; "
    "centred on the calibration's A/A mean (the launch positions' effect), whose variance is carried"
)


def triplet_log_speedup(ratios: Sequence[float]) -> float:
    """The paired log speedup of one triplet: the mean of the log of its window ratios (owner's ratio_w)."""
    if not ratios or any(not (r > 0 and math.isfinite(r)) for r in ratios):
        raise ValueError(f"window ratios must be finite and positive, got {list(ratios)}")
    return math.fsum(math.log(r) for r in ratios) / len(ratios)


@dataclass(frozen=True)
class Position:
    """What an A/A calibration measured of the launch positions (issue 52): identical arms, so its mean d is the
    position effect (p0 + p2) / 2 - p1 that every triplet's d carries in either order, and its mean u = log(A / B)
    is p0 - p2 for the order A C B (a B C A triplet carries -u). `launches`: the A/A triplets of those means; their
    sampling variance (SD of d)^2 / launches is carried into every interval that subtracts them."""

    d: float
    u: float
    launches: int


@dataclass(frozen=True)
class StepProfile:
    """The baseline's mean log step time at each measured step (the owner's windows, in step order), from an A/A
    calibration: what the candidate's step-to-step effect is fitted against (the docstring of noise.py)."""

    steps: tuple[int, ...]
    log_times: tuple[float, ...]

    def fits(self, steps: Sequence[int]) -> bool:
        """Whether it speaks for these measured steps: the same steps, at least 3 (a line leaves a df), and a
        profile that varies (a flat one has no line to fit)."""
        return (tuple(steps) == self.steps and len(self.steps) >= 3
                and max(self.log_times) > min(self.log_times))


@dataclass(frozen=True)
class Spread:
    """An estimate of a standard deviation (log scale) with its degrees of freedom; a calibration's also carries its
    position effect (None: the run's own spread, or no correction)."""

    sd: float
    df: float  # an integer, except the equivalent df of a calibration scaled by the candidate's noise (noise.py)
    position: Position | None = None

    def scaled_by(self, factor: float, df: float) -> Spread:
        """The same estimate with its SD times factor and another df, its position effect kept."""
        return replace(self, sd=self.sd * factor, df=df)

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        """The sample SD of `values` (df = n - 1); None for fewer than two values."""
        if len(values) < 2:
            return None
        m = math.fsum(values) / len(values)
        return cls(math.sqrt(math.fsum((x - m) ** 2 for x in values) / (len(values) - 1)), len(values) - 1)


class NoiseScale(Protocol):
    """What the interval needs of noise.py's NoiseScale (the candidate's within-launch noise against the
    baseline's): the calibration scaled by it. A protocol, so that this module imports nothing of noise.py, which
    builds on it."""

    def scaled(self, calibration: Spread, level: float) -> Spread: ...


def pooled(*spreads: Spread) -> Spread:
    """Pooled SD: variances weighted by their df, df added."""
    df = sum(s.df for s in spreads)
    if df == 0:
        raise ValueError("pooling needs at least one degree of freedom")
    return Spread(math.sqrt(math.fsum(s.df * s.sd**2 for s in spreads) / df), df)


def window_spread(ratios_by_triplet: Sequence[Sequence[float]]) -> Spread | None:
    """Within-triplet SD between windows: residuals of log(ratio_w) about each triplet's d, pooled."""
    ss, df = 0.0, 0
    for ratios in ratios_by_triplet:
        if len(ratios) >= 2:
            d = triplet_log_speedup(ratios)
            ss += math.fsum((math.log(r) - d) ** 2 for r in ratios)
            df += len(ratios) - 1
    return Spread(math.sqrt(ss / df), df) if df else None


@dataclass(frozen=True)
class SpreadCheck:
    """Is the run's between-triplet spread larger than the calibrated one? (one-sided F test)"""

    run: Spread
    calibration: Spread
    f: float
    p_value: float
    larger: bool

    @property
    def words(self) -> str:
        cmp = "larger than" if self.larger else "consistent with"
        return (f"the run's triplet SD {self.run.sd:.4f} (df {self.run.df}) is {cmp} the calibration's "
                f"{self.calibration.sd:.4f} (df {self.calibration.df}): F = {self.f:.3g}, one-sided p = "
                f"{self.p_value:.3g}")


def spread_check(run: Spread, calibration: Spread, alpha: float = SPREAD_ALPHA) -> SpreadCheck:
    if calibration.sd <= 0.0:
        f = math.inf if run.sd > 0 else 1.0
        p = 0.0 if run.sd > 0 else 1.0
    else:
        f = (run.sd / calibration.sd) ** 2
        p = float(dist.f_sf(f, run.df, calibration.df))
    return SpreadCheck(run, calibration, f, p, p < alpha)


def t_critical(level: float, df: float) -> float:
    """Two-sided Student t multiplier: P(|T_df| <= c) = level."""
    return float(dist.t_ppf(0.5 + level / 2.0, df))


@dataclass(frozen=True)
class Interval:
    """The speedup (baseline time / candidate time: above 1 the candidate is faster) with its interval."""

    estimate: float
    low: float  # 0.0 when unbounded
    high: float  # inf when unbounded
    level: float  # the coverage the interval claims (simultaneous over the looks of a sequential rule)
    nominal_level: float  # the level of the t multiplier at this look (= level for a fixed design)
    method: str
    triplets: int
    log_speedups: tuple[float, ...]  # d of each triplet
    sd: float | None  # the between-triplet SD used (log scale)
    df: float
    variance_source: str  # pooled | run | calibration | none
    critical: float | None
    check: SpreadCheck | None
    triplets_for_target: int | None  # triplets for a +-5 % interval at this SD (None: beyond reach or unknown)
    noise: NoiseScale | None = None  # the calibration was scaled by the candidate's within-launch noise
    carried_sd: float = 0.0  # SD of the subtracted A/A mean (log scale): a floor on the width that K cannot lower

    @property
    def bounded(self) -> bool:
        return self.sd is not None

    @property
    def covers_one(self) -> bool:
        return self.low <= 1.0 <= self.high

    @property
    def half_width(self) -> float:
        """Relative: sqrt(high / low) - 1 (inf when unbounded)."""
        return math.sqrt(self.high / self.low) - 1.0 if self.low > 0 and math.isfinite(self.high) else math.inf

    @property
    def per_triplet(self) -> tuple[float, ...]:
        return tuple(math.exp(d) for d in self.log_speedups)


def position_variance(calibration: Spread | None) -> float:
    """The variance of the A/A mean a calibration's position effect subtracts from every triplet's d (issue 52):
    s_cal^2 / n over its n launches; 0 where nothing is subtracted. It does not shrink with the run's triplets."""
    if calibration is None or calibration.df <= 0 or calibration.position is None:
        return 0.0
    launches = calibration.position.launches
    return calibration.sd**2 / launches if launches > 0 else 0.0


def width_floor(carried: float, level: float = LEVEL) -> float:
    """The relative half-width no number of triplets goes below: the A/A mean's own error, z * sqrt(carried)."""
    return math.expm1(float(dist.norm_ppf(0.5 + level / 2.0)) * math.sqrt(carried))


def expected_half_width(calibration: Spread, k: int, level: float = LEVEL) -> float:
    """The relative half-width of a K-triplet interval whose own spread is the calibration's (a candidate as steady
    as the baseline): exp(t(df_cal + K - 1) * sqrt(s^2 / K + carried)) - 1, as paired_interval computes it."""
    if calibration.df <= 0 or k < 1:
        raise ValueError("the expected width needs a calibration with a df and at least one triplet")
    crit = t_critical(level, calibration.df + k - 1)
    return math.expm1(crit * math.sqrt(calibration.sd**2 / k + position_variance(calibration)))


def triplets_needed(sd: float, calibration_df: float = 0, level: float = LEVEL,
                    target: float = TARGET_HALF_WIDTH, carried: float = 0.0) -> int | None:
    """Smallest K whose fixed-design interval (df = calibration_df + K - 1) has relative half-width <= target: the
    half-width paired_interval gives, t * sqrt(sd^2 / K + carried), where `carried` is the variance of the A/A mean
    subtracted from every triplet (position_variance). None when no K reaches it: beyond MAX_TRIPLETS, or, with a
    carried variance, when the A/A mean's own error alone is as wide as the target (more A/A launches are needed,
    not more triplets)."""
    goal = math.log1p(target)
    z = float(dist.norm_ppf(0.5 + level / 2.0))
    room = goal**2 - z**2 * carried  # what the triplets' own variance may take as K grows without bound
    if room <= 0.0:
        return None  # t > z at every df: even infinitely many triplets leave the A/A mean's error

    def reached(k: int) -> bool:  # monotone in k: t falls with its df, and sd^2 / k with k
        df = calibration_df + k - 1
        if df < 1:
            return False  # no spread yet (sd 0 included: the first K with df >= 1 is the answer)
        t = t_critical(level, df)  # nothing carried: the former expression, bit for bit
        return (t * sd / math.sqrt(k) if carried == 0.0 else t * math.sqrt(sd**2 / k + carried)) <= goal

    for k in range(1, 201):
        if reached(k):
            return k
    # beyond: the normal quantile's K is a lower bound (t > z at every df); step up from it to the t-based K (a few
    # triplets without a carried variance: about (1 + z^2) / 2)
    k = max(201, math.ceil(z**2 * sd**2 / room))
    while k <= MAX_TRIPLETS:
        if reached(k):
            return k
        k += 1
    return None


def variance_for(d: Sequence[float], calibration: Spread | None) -> tuple[Spread | None, str, SpreadCheck | None]:
    """The between-triplet SD an interval uses, where it comes from, and the spread check that chose it."""
    run = Spread.of(d)
    if calibration is None or calibration.df == 0:
        return (run, "run", None) if run is not None else (None, "none", None)
    if run is None:
        return calibration, "calibration", None
    check = spread_check(run, calibration)
    if check.larger:
        return run, "run", check
    return pooled(run, calibration), "pooled", check


def paired_interval(d: Sequence[float], calibration: Spread | None = None, level: float = LEVEL,
                    nominal_level: float | None = None, noise: NoiseScale | None = None) -> Interval:
    """The interval of exp(mean d) over K triplets. `nominal_level`: the level of this look's t multiplier when a
    sequential rule holds the overall `level` (sequential.py); None for a fixed design. `noise`: the candidate's
    within-launch noise (noise.py): the calibration is scaled by sqrt(R), with the df whose t multiplier is the exact
    one of the scaled pivot at this look's level. A calibration with a position effect
    (Spread.position): the interval is of mean d minus the A/A mean, its half-width t * sqrt(s^2 / K + s_cal^2 / n)
    (n: the A/A launches of that mean; exact t at K = 1 without noise scale, and pooled df otherwise)."""
    if not d:
        raise ValueError("the interval needs at least one triplet")
    nominal = level if nominal_level is None else nominal_level
    k = len(d)
    mean = math.fsum(d) / k
    # the calibration's A/A mean is the launch positions' effect on d: subtracted, its variance carried (issue 52)
    position = calibration.position if calibration is not None and calibration.df > 0 else None
    carried = position_variance(calibration)
    if position is not None and calibration is not None and position.launches > 0:
        mean -= position.d
    if calibration is not None and calibration.df > 0 and noise is not None:
        calibration = noise.scaled(calibration, nominal)
    else:
        noise = None
    spread, source, check = variance_for(d, calibration)
    if spread is None:
        return Interval(math.exp(mean), 0.0, math.inf, level, nominal, METHOD, k, tuple(d), None, 0, source, None,
                        None, None)
    crit = t_critical(nominal, spread.df)
    half = crit * math.sqrt(spread.sd**2 / k + carried)
    cal_df = spread.df - (k - 1) if source in ("pooled", "calibration") else 0
    return Interval(
        estimate=math.exp(mean), low=math.exp(mean - half), high=math.exp(mean + half), level=level,
        nominal_level=nominal, method=METHOD, triplets=k, log_speedups=tuple(d), sd=spread.sd, df=spread.df,
        variance_source=source, critical=crit, check=check,
        triplets_for_target=triplets_needed(spread.sd, cal_df, level, carried=carried),
        noise=noise if source in ("pooled", "calibration") else None, carried_sd=math.sqrt(carried),
    )


@dataclass(frozen=True)
class Outlier:
    """A triplet (window None) or a window whose paired log speedup stands apart from the rest."""

    triplet: int  # 0-based position among the run's triplets
    window: int | None
    z: float  # studentized deviation
    p_value: float  # two-sided, before the Bonferroni correction
    df: float


def outlier_triplets(d: Sequence[float], calibration: Spread | None = None,
                     alpha: float = OUTLIER_ALPHA) -> list[Outlier]:
    """Leave-one-out: each triplet against the mean and pooled SD of the others (and the calibration), a
    studentized prediction error; flagged when its p-value times K is below alpha (Bonferroni)."""
    k = len(d)
    if k < 2 or (k == 2 and calibration is None):
        return []
    out = []
    for i in range(k):
        rest = [x for j, x in enumerate(d) if j != i]
        spread, _, _ = variance_for(rest, calibration)
        if spread is None or spread.sd <= 0.0:
            continue
        m = math.fsum(rest) / len(rest)
        z = (d[i] - m) / (spread.sd * math.sqrt(1.0 + 1.0 / len(rest)))
        p = float(2.0 * dist.t_sf(abs(z), spread.df))
        if p * k < alpha:
            out.append(Outlier(i, None, z, p, spread.df))
    return out


def outlier_windows(ratios_by_triplet: Sequence[Sequence[float]], window_sd: Spread | None = None,
                    alpha: float = OUTLIER_ALPHA) -> list[Outlier]:
    """Each window's log ratio against its triplet's d, scaled by the within-triplet window SD (the calibration's
    when given, else the run's own); flagged when its p-value times the number of windows is below alpha."""
    spread = window_sd if window_sd is not None else window_spread(ratios_by_triplet)
    if spread is None or spread.sd <= 0.0:
        return []
    n = sum(len(r) for r in ratios_by_triplet)
    out = []
    for i, ratios in enumerate(ratios_by_triplet):
        nw = len(ratios)
        if nw < 2:
            continue
        d = triplet_log_speedup(ratios)
        for w, r in enumerate(ratios):
            z = (math.log(r) - d) / (spread.sd * math.sqrt((nw - 1) / nw))
            p = float(2.0 * dist.t_sf(abs(z), spread.df))
            if p * n < alpha:
                out.append(Outlier(i, w, z, p, spread.df))
    return out

