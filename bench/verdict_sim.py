"""`bench_verdict.py --sim`: a seeded Monte Carlo of whole runs (step times of A, C, B launches) judged by the
verdict's rules: fixed K = 1 with a calibration, K = 2, K = 3 and the sequential rule under optional stopping.

Step times -> the owner's windows and ratios -> per-triplet d -> intervals. The intervals are computed for 10,000
sequences at once with numpy; the critical values and nominal levels come from ledger/verdict (t_critical,
SequentialRule.nominal_level) and a subsample of sequences is judged again by the module's own functions
(windows.speedup, triplet_log_speedup, paired_interval, SequentialRule), which must agree to 1e-9.

The candidate's noise check takes its step contrasts about a line in the calibration's step profile (issue 50: each
measured step's mean log time over the A/A launches, as `orch calibrate` records it); the rule `K=1 + cal, about
the mean` is the same K = 1 rule with the contrasts about their mean (before issue 50), on the same sequences. The
`alternating` scenarios have r3-mini's GPU-bound steps (0.83 s and 1.80 s in turn) and a candidate that adds a fixed
time to every step (`candidate_add_s`), the shape of the 5% slowdown that the rule about the mean left undecided.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
from scipy import stats as sps

from ledger.verdict.decide.decision import (
    baseline_effects,
    decide,
    outlier_check,
    outlier_effects,
    verdict_interval,
    window_effects,
)
from ledger.verdict.decide.noise import (
    AB_FACTOR,
    ArmSpread,
    NoiseEvidence,
    arm_spread,
    baseline_disagreement,
    baseline_outliers,
    critical_scaled,
    equivalent_df,
    ratio_floor,
    triplet_arm_spread,
)
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import replay
from ledger.verdict.decide.stats import (
    LEVEL,
    OUTLIER_ALPHA,
    SPREAD_ALPHA,
    TARGET_HALF_WIDTH,
    Position,
    Spread,
    StepProfile,
    outlier_triplets,
    outlier_windows,
    pooled,
    triplet_log_speedup,
    window_spread,
)
from ledger.verdict.decide.windows import speedup, window_steps
from protocol.plan import triplets

STEPS, WARMUP, WINDOW = 16, 10, 2  # the owner's measurement (DESIGN.md section 5)
MAX_TRIPLETS = 6
CAL_TRIPLETS = 5  # the A/A calibration each simulated host measured once


@dataclass(frozen=True)
class HostModel:
    """Multiplicative noise on a step's time (log scale, median 1), from the recorded evidence (see SOURCES)."""

    launch_sd: float = 0.11  # a fresh launch's own speed
    step_sd: float = 0.08  # each step around its launch's speed
    drift_mean: float = 0.0  # linear drift per launch position inside a triplet (A -> C -> B order)
    drift_sd: float = 0.0
    candidate_noise: float = 1.0  # the candidate's launch and step SD are this times the baseline's
    launch_outlier_p: float = 0.0  # a launch slowed as a whole (a busy host)
    launch_outlier: float = 1.4
    window_outlier_p: float = 0.0  # one window of one launch slowed
    window_outlier: float = 1.5
    candidate_burst: float = 1.0  # one window in three of every candidate launch this much slower, the other two
    # faster by its square root: the launch's log-mean over its windows, and so E[d], unchanged (a null)
    candidate_step_noise: float | None = None  # the candidate's step SD factor alone (None: candidate_noise); issue
    # 52: a candidate steadier inside its launches (CUDA graphs) with the baseline's launch spread
    positions: tuple[float, float, float] = (0.0, 0.0, 0.0)  # log level of the launch at position 0, 1, 2 of every
    # triplet, A/A calibration included (issue 52: A fast with C = B slow, B slow, the middle launch slow)
    candidate_add_s: float = 0.0  # issue 50: seconds of work added to every step of the candidate (scaled by its
    # launch's and step's noise like the rest of the step)


SOURCES = {
    "launch_sd": "0.11: launch-to-launch log SD of r3-mini on CPU and on one H200 (issue 26; README 'Measurement, "
                 "noise and evidence'); it gives a per-triplet d SD of about 0.14, as the CPU nulls "
                 "(docs/validation/cpu2_null_*.json: d = 0.126, -0.064) and the H200 null K = 3 (d SD about 0.17) "
                 "show. 0.20 in the noisy scenario (the H200 eager baseline's launch SD, old test_stats)",
    "step_sd": "0.08: docs/validation/cpu2_bench_null.json window-level SD 0.057 of a 2-step window (x sqrt 2)",
    "quiet": "launch 0.015, step 0.02: the H200 25% slowdown's per-triplet headlines 0.758 / 0.781 / 0.766 "
             "(issue 26; log SD 0.015)",
    "drift": "0.02 +- 0.04 per launch position: A/B drifts of 0.02-0.18 (CPU) and up to 0.37 (H200) in "
             "docs/validation/*null*.json, most of it explained by the launch SD; a steady heating trend on top",
    "candidate_noise": "1.5 or 1/1.5 in the unequal-arms scenarios: the H200 null's C windows had step CVs "
                       "0.01-0.18 where A's had 0.24-0.31 (docs/validation/h200x1_null.json)",
    "candidate_burst": "1.5: one window in three of each candidate launch 1.5x slower, the other two 1/sqrt(1.5) "
                       "faster (E[d] = 0): noise that arrives in bursts (issue 34)",
    "outliers": "2% of launches 1.4x slower, 2% of windows of a launch 1.5x slower: the H200 null's w1 C/A = 1.33",
    "base": "each step's own work uniform in [0.3, 0.9] s, the same for every launch of a sequence (same seeds)",
    "steadier": "issue 52: candidate step SD x 0 or x 0.5 with the baseline's launch SD: R = (lambda^2 + 1/2) / 1.5 "
                "= 1/3 or 1/2 (a candidate that captures CUDA graphs)",
    "positions": "issue 52: real GPU runs had B 8-52 % slower than A; levels 5-30 % per launch position, the same "
                 "in the A/A calibration (A C B) and the run (A C B, then B C A)",
    "alternating": "issue 50: r3-mini's GPU-bound steps alternate 0.83 s / 1.80 s (gpu_bound_h100x1_adf16d8.json); "
                   "the 5% slowdown added 63-66 ms to each (0.065 s here: true speedup 0.9529x)",
}
ALTERNATING = np.array([0.83, 1.80] * (16 // 2))  # r3-mini GPU-bound step times (s), steps 0-15
HOST = HostModel(drift_mean=0.02, drift_sd=0.04, launch_outlier_p=0.02, window_outlier_p=0.02)
QUIET = replace(HOST, launch_sd=0.015, step_sd=0.02)


@dataclass(frozen=True)
class Scenario:
    name: str
    ratio: float  # the candidate's speedup factor on every step (baseline median step time / candidate's)
    host: HostModel
    base: str = "uniform"  # each step's own work: "uniform" in [0.3, 0.9] s per sequence, or "alternating"

    def truth(self) -> float:
        """The true speedup in the owner's terms: ratio, times the window ratio of the added work (alternating
        steps: every window holds one short and one long step, so it is the same in every window)."""
        if self.host.candidate_add_s == 0.0:
            return self.ratio
        assert self.base == "alternating"
        pair = float(ALTERNATING[:2].sum())
        return self.ratio * pair / (pair + 2.0 * self.host.candidate_add_s)


SCENARIOS = (
    Scenario("null, clean host", 1.0, HostModel()),
    Scenario("null, host model", 1.0, HOST),
    Scenario("null, host, candidate 1.5x noisier", 1.0, replace(HOST, candidate_noise=1.5)),
    Scenario("null, host, candidate 1.5x quieter", 1.0, replace(HOST, candidate_noise=1 / 1.5)),
    Scenario("null, host, candidate 2x noisier", 1.0, replace(HOST, candidate_noise=2.0)),
    Scenario("null, host, candidate bursts (one slow window in three)", 1.0, replace(HOST, candidate_burst=1.5)),
    Scenario("null, noisy host", 1.0, replace(HOST, launch_sd=0.20)),
    Scenario("null, quiet host", 1.0, QUIET),
    # issue 52: a candidate steadier inside its launches with the baseline's launch spread, and launch-position effects
    Scenario("null, host, candidate steadier (R = 1/3), same launch spread", 1.0,
             replace(HOST, candidate_step_noise=0.0)),
    Scenario("null, host, candidate steadier (R = 1/2), same launch spread", 1.0,
             replace(HOST, candidate_step_noise=0.5)),
    Scenario("null, host, steadier (R = 1/3) and B 20% slower", 1.0,
             replace(HOST, candidate_step_noise=0.0, positions=(0.0, 0.0, math.log(1.2)))),
    Scenario("null, host, A fast, C and B 10% slower", 1.0,
             replace(HOST, positions=(0.0, math.log(1.1), math.log(1.1)))),
    Scenario("null, host, A fast, C and B 30% slower", 1.0,
             replace(HOST, positions=(0.0, math.log(1.3), math.log(1.3)))),
    Scenario("null, host, A = C, B 10% slower", 1.0, replace(HOST, positions=(0.0, 0.0, math.log(1.1)))),
    Scenario("null, host, A = C, B 30% slower", 1.0, replace(HOST, positions=(0.0, 0.0, math.log(1.3)))),
    Scenario("null, host, middle launch 5% slower", 1.0, replace(HOST, positions=(0.0, math.log(1.05), 0.0))),
    Scenario("null, host, middle launch 30% slower", 1.0, replace(HOST, positions=(0.0, math.log(1.3), 0.0))),
    Scenario("null, quiet host, A fast, C and B 30% slower", 1.0,
             replace(QUIET, positions=(0.0, math.log(1.3), math.log(1.3)))),
    Scenario("null, quiet host, A = C, B 30% slower", 1.0, replace(QUIET, positions=(0.0, 0.0, math.log(1.3)))),
    Scenario("10% slowdown, host model", 1 / 1.10, HOST),
    Scenario("25% slowdown, host model", 0.8, HOST),
    Scenario("10% slowdown, quiet host", 1 / 1.10, QUIET),
    Scenario("25% slowdown, quiet host", 0.8, QUIET),
    # issue 50: r3-mini's alternating steps, and a slowdown that adds a fixed time to every step
    Scenario("null, host, alternating steps", 1.0, HOST, "alternating"),
    Scenario("null, quiet host, alternating steps", 1.0, QUIET, "alternating"),
    Scenario("5% slowdown as 65 ms a step, quiet host, alternating steps", 1.0, replace(QUIET, candidate_add_s=0.065),
             "alternating"),
    Scenario("5% slowdown as 65 ms a step, GPU host (launch 0.4%, step 0.6%), alternating steps", 1.0,
             replace(QUIET, launch_sd=0.004, step_sd=0.006, drift_mean=0.0, drift_sd=0.0, launch_outlier_p=0.0,
                     window_outlier_p=0.0, candidate_add_s=0.065), "alternating"),
)
MEAN_RULE = "K=1 + cal, about the mean"  # issue 52's K = 1 rule with the step contrasts about their mean (no profile)
RULES = ("K=1 + cal", "K=2", "K=2 + cal", "K=3", "K=3 + cal", "seq<=6 + cal", "seq<=6", MEAN_RULE,
         "K=1 + cal, issue 34")
# the rule as issue 34 left it (the calibration scaled by sqrt(R) with no floor, the newest calibration's SD, no
# position correction, u against 0): K = 1 only, for before/after on the same sequences
BEFORE = "K=1 + cal, issue 34"



def _orders() -> np.ndarray:
    """Launch position (0, 1, 2) of roles A, C, B in each triplet of the plan (odd A C B, even B C A)."""
    out = []
    for t in triplets(MAX_TRIPLETS):
        pos = {label: i for i, label in enumerate(t.order)}
        out.append([pos[t.a], pos[t.c], pos[t.b]])
    return np.array(out, dtype=float)


def step_times(rng: np.random.Generator, n: int, k: int, ratio: float, host: HostModel,
               base: np.ndarray, aa: bool = False) -> np.ndarray:
    """Step times [sequence, triplet, role A/C/B, step] of n sequences of k triplets (aa: `orch calibrate`'s
    one-triplet A/A launches, each in the order A C B)."""
    noise = np.array([1.0, host.candidate_noise, 1.0])[None, None, :]
    steps = host.candidate_noise if host.candidate_step_noise is None else host.candidate_step_noise
    step_noise = np.array([1.0, steps, 1.0])[None, None, :, None]
    orders = np.tile([0.0, 1.0, 2.0], (k, 1)) if aa else _orders()[:k]
    launch = rng.normal(0.0, host.launch_sd, size=(n, k, 3)) * noise
    drift = rng.normal(host.drift_mean, host.drift_sd, size=(n, k, 1)) * orders[None, :, :]
    launch = launch + np.asarray(host.positions)[orders.astype(int)][None, :, :]
    log_t = (launch + drift)[..., None] + rng.normal(0.0, host.step_sd, size=(n, k, 3, STEPS)) * step_noise
    work = np.broadcast_to(base[:, None, None, :], log_t.shape).copy()
    if host.candidate_add_s and not aa:
        work[:, :, 1, :] += host.candidate_add_s
    times = work * np.exp(log_t)
    times[:, :, 1, :] /= ratio
    if host.launch_outlier_p > 0:
        times *= np.where(rng.random((n, k, 3)) < host.launch_outlier_p, host.launch_outlier, 1.0)[..., None]
    if host.window_outlier_p > 0:
        for steps in window_steps(STEPS, WARMUP, WINDOW):
            hit = rng.random((n, k, 3)) < host.window_outlier_p
            times[..., list(steps)] *= np.where(hit, host.window_outlier, 1.0)[..., None]
    if host.candidate_burst != 1.0:
        slow = rng.integers(0, 3, size=(n, k))
        for w, steps in enumerate(window_steps(STEPS, WARMUP, WINDOW)):
            f = np.where(slow == w, host.candidate_burst, host.candidate_burst ** -0.5)
            times[:, :, 1, list(steps)] *= f[..., None]
    return times


MEASURED = [s for w in window_steps(STEPS, WARMUP, WINDOW) for s in w]
CAL_STEP_DF = CAL_TRIPLETS * 2 * (len(MEASURED) - 1)  # two contrasts of the measured steps per A/A launch


def contrasts(times: np.ndarray, profile: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Sums of squares of the arm contrasts y and v over the measured steps: [sequence, triplet] each
    (ledger/verdict/decide/noise.py arm_spread). v about its mean; y about its mean (df len(MEASURED) - 1 per
    triplet) or, with the calibration's step profile [sequence, step], about its least-squares line in it (df
    len(MEASURED) - 2)."""
    lg = np.log(times[..., MEASURED])
    y = lg[:, :, 1] - (lg[:, :, 0] + lg[:, :, 2]) / 2.0
    v = lg[:, :, 0] - lg[:, :, 2]
    yc = y - y.mean(-1, keepdims=True)
    if profile is not None:
        x = (profile - profile.mean(-1, keepdims=True))[:, None, :]
        yc = yc - (x * yc).sum(-1, keepdims=True) / (x * x).sum(-1, keepdims=True) * x
    return (yc**2).sum(-1), ((v - v.mean(-1, keepdims=True)) ** 2).sum(-1)


def step_profile(aa: np.ndarray) -> np.ndarray:
    """The calibration's step profile [sequence, measured step]: the mean log time over its A/A launches and their
    three arms (orchestrator/run/calibrate.mean_profile of noise.aa_step_profile)."""
    return np.log(aa[..., MEASURED]).mean(axis=(1, 2))


@dataclass
class Noise:
    """The noise check's inputs per sequence: the run's contrasts and the calibration's baseline step variance."""

    ss_y: np.ndarray  # [n, k]
    ss_v: np.ndarray
    cal_var: np.ndarray  # [n] sigma^2 of the A/A steps (df CAL_STEP_DF)
    fitted: bool = True  # ss_y about the line in the calibration's step profile (one df fewer a triplet)

    def scale(self, k: int) -> tuple[np.ndarray, int, int]:
        """(R, d1, d2) after the first k triplets."""
        m = len(MEASURED) - 1
        d1 = (m - 1 if self.fitted else m) * k
        base = (self.ss_v[:, :k].sum(1) / 2.0 + CAL_STEP_DF * self.cal_var) / (m * k + CAL_STEP_DF)
        return self.ss_y[:, :k].sum(1) / d1 / (1.5 * base), d1, m * k + CAL_STEP_DF


def _windows(times: np.ndarray) -> np.ndarray:
    """Each arm's summed step time in each of the owner's windows: [sequence, triplet, role, window]."""
    return np.stack([times[..., list(s)].sum(axis=-1) for s in window_steps(STEPS, WARMUP, WINDOW)], axis=-1)


def window_ratios(times: np.ndarray) -> np.ndarray:
    """The owner's ratio_w = mean(A_w, B_w) / C_w of each window: [sequence, triplet, window]."""
    wins = _windows(times)
    return ((wins[:, :, 0] + wins[:, :, 2]) / 2.0) / wins[:, :, 1]


def ab_disagreement(times: np.ndarray) -> np.ndarray:
    """u = mean over windows of log(A_w / B_w) of each triplet: [sequence, triplet] (noise.baseline_disagreement)."""
    wins = _windows(times)
    return np.log(wins[:, :, 0] / wins[:, :, 2]).mean(axis=-1)


@dataclass
class Looks:
    """Vectorized paired_interval over n sequences at one look: log-scale mean and half-width (inf: unbounded)."""

    mean: np.ndarray
    half: np.ndarray
    veto: np.ndarray | None = None  # decisions the window check takes back (K = 1)


@dataclass
class Cal:
    """Each sequence's A/A calibration as a rule reads it: the SD of d (df CAL_TRIPLETS - 1) and, with issue 52's
    rules, its A/A means of d and u (stats.Position, n = CAL_TRIPLETS) and the floor of the noise scale."""

    sd: np.ndarray  # [n]
    mean_d: np.ndarray | None = None  # None: no position correction (the rules before issue 52)
    mean_u: np.ndarray | None = None
    floor: bool = True  # max(R, r0) (noise.ratio_floor); False: R as issue 34 applied it

    @property
    def launches(self) -> int:
        return CAL_TRIPLETS if self.mean_d is not None else 0

    @property
    def carried(self) -> np.ndarray:
        """The variance of the subtracted A/A mean: sd^2 / n (0 without a correction)."""
        return self.sd**2 / CAL_TRIPLETS if self.mean_d is not None else np.zeros_like(self.sd)

    def shift(self) -> np.ndarray:
        return self.mean_d if self.mean_d is not None else np.zeros_like(self.sd)

    def take(self, keep: np.ndarray) -> Cal:
        return Cal(self.sd[keep], None if self.mean_d is None else self.mean_d[keep],
                   None if self.mean_u is None else self.mean_u[keep], self.floor)

    def spread(self, i: int) -> Spread:
        """Sequence i's calibration as ledger/verdict reads it."""
        pos = None if self.mean_d is None or self.mean_u is None else Position(
            float(self.mean_d[i]), float(self.mean_u[i]), CAL_TRIPLETS)
        return Spread(float(self.sd[i]), CAL_TRIPLETS - 1, pos)


def _applied(r: np.ndarray, cal: Cal, nominal: float, d1: int, d2: int) -> np.ndarray:
    return np.maximum(r, ratio_floor(round(nominal, 12), CAL_TRIPLETS - 1, d1, d2)) if cal.floor else r


def intervals(d: np.ndarray, cal: Cal | None, nominal: float, noise: Noise | None = None) -> Looks:
    """d [n, k]; cal: the calibration (None: none): stats.variance_for's choice; noise: the calibration scaled by
    sqrt(max(R, r0)) with the equivalent df (ledger/verdict/decide/noise.py); the A/A mean subtracted, its variance
    carried (stats.paired_interval)."""
    n, k = d.shape
    mean = d.mean(axis=1)
    if cal is None and k == 1:
        return Looks(mean, np.full(n, math.inf))
    if cal is None:
        sd, df = d.std(axis=1, ddof=1), np.full(n, k - 1)
        crit = sps.t.ppf(0.5 + nominal / 2.0, df)
        return Looks(mean, crit * sd / math.sqrt(k))
    mean = mean - cal.shift()
    carried = cal.carried
    sd_cal, cal_df = cal.sd, float(CAL_TRIPLETS - 1)
    if noise is not None:
        r, d1, d2 = noise.scale(k)
        sd_cal = cal.sd * np.sqrt(_applied(r, cal, nominal, d1, d2))
        cal_df = equivalent_df(round(nominal, 12), CAL_TRIPLETS - 1, d1, d2, cal.launches)
    if k == 1:
        sd, df = sd_cal, np.full(n, cal_df)
    else:
        run = d.std(axis=1, ddof=1)
        larger = sps.f.sf((run / sd_cal) ** 2, k - 1, cal_df) < SPREAD_ALPHA
        pooled = np.sqrt(((k - 1) * run**2 + cal_df * sd_cal**2) / (k - 1 + cal_df))
        sd, df = np.where(larger, run, pooled), np.where(larger, k - 1, k - 1 + cal_df)
    crit = sps.t.ppf(0.5 + nominal / 2.0, df)
    return Looks(mean, crit * np.sqrt(sd**2 / k + carried))


def _judge(lk: Looks) -> tuple[np.ndarray, np.ndarray]:
    """(decided faster, decided slower) per sequence."""
    keep = np.ones(lk.mean.shape, bool) if lk.veto is None else ~lk.veto
    return (lk.mean - lk.half > 0.0) & keep, (lk.mean + lk.half < 0.0) & keep


def window_check(lk: Looks, logr: np.ndarray, cal: Cal, cal_w: np.ndarray, noise: Noise,
                 level: float = LEVEL) -> Looks:
    """K = 1: a window flagged against the calibrated window SD (df CAL_TRIPLETS * 2, Bonferroni over 3 windows,
    stats.outlier_windows) takes the decision back unless the interval without it decides the same way
    (decision.window_effects, noise.without_window). logr [n, windows] of the one triplet."""
    nw = logr.shape[1]
    dev = logr - logr.mean(1, keepdims=True)
    z = dev / (cal_w[:, None] * math.sqrt((nw - 1) / nw))
    flagged = 2.0 * sps.t.sf(np.abs(z), CAL_TRIPLETS * (nw - 1)) * nw < OUTLIER_ALPHA
    r, d1, d2 = noise.scale(1)
    crit = critical_scaled(round(level, 12), CAL_TRIPLETS - 1, d1, d2, cal.launches)  # the look's own level
    var = (cal.sd**2 + cal_w**2 * (1.0 / (nw - 1) - 1.0 / nw)) * _applied(r, cal, level, d1, d2) + cal.carried
    half = crit * np.sqrt(var)
    faster, slower = lk.mean - lk.half > 0.0, lk.mean + lk.half < 0.0
    veto = np.zeros(lk.mean.shape, bool)
    for w in range(nw):
        rest = (logr.sum(1) - logr[:, w]) / (nw - 1) - cal.shift()
        holds = np.where(faster, rest - half > 0.0, rest + half < 0.0)
        veto |= flagged[:, w] & (faster | slower) & ~holds
    return Looks(lk.mean, lk.half, veto)


def baseline_check(lk: Looks, d: np.ndarray, u: np.ndarray, cal: Cal, noise: Noise, taken: np.ndarray,
                   nominal: dict[int, float]) -> Looks:
    """A triplet whose A/B disagreement u stands apart from the calibrated between-launch spread (z = (u - m_u) /
    (s_cal sqrt(4/3 (1 + 1/n))), m_u the A/A mean u of its order, t with the calibration's df, Bonferroni over the
    run's triplets: noise.baseline_outliers) takes the decision back unless the same rule's interval without it
    decides the same way (decision.baseline_effects); at K = 1 nothing is left, so it always does. taken: each
    sequence's triplets; nominal[k]: the level of look k."""
    faster, slower = _judge(lk)
    sign = np.where(np.arange(u.shape[1]) % 2 == 0, 1.0, -1.0)[None, :]
    expected = (cal.mean_u[:, None] * sign) if cal.mean_u is not None else 0.0
    scale = cal.sd[:, None] * np.sqrt(AB_FACTOR * (1.0 + (1.0 / CAL_TRIPLETS if cal.mean_d is not None else 0.0)))
    p = 2.0 * sps.t.sf(np.abs(u - expected) / scale, CAL_TRIPLETS - 1)
    veto = np.zeros(lk.mean.shape, bool)
    for k in np.unique(taken):
        k = int(k)
        for i in range(k):
            hit = (taken == k) & (p[:, i] * k < OUTLIER_ALPHA) & (faster | slower)
            if not hit.any():
                continue
            if k == 1:
                veto |= hit
                continue
            keep = [j for j in range(d.shape[1]) if j != i]
            rest = Noise(noise.ss_y[:, keep], noise.ss_v[:, keep], noise.cal_var, noise.fitted)
            w = intervals(d[:, keep][:, :k - 1], cal, nominal[k - 1], rest)
            holds = np.where(faster, w.mean - w.half > 0.0, w.mean + w.half < 0.0)
            veto |= hit & ~holds
    return Looks(lk.mean, lk.half, veto if lk.veto is None else veto | lk.veto)


def sequential(d: np.ndarray, cal: Cal | None, noise: Noise | None = None,
               u: np.ndarray | None = None) -> tuple[Looks, np.ndarray, np.ndarray]:
    """SequentialRule(MAX_TRIPLETS) with optional stopping, as sequential_doc.look: the interval at each sequence's
    stop, triplets taken, and why it stopped (0 decided, 1 precise, 2 maximum). At every look, a decision that rests
    on an outlier triplet (decision.outlier_check, the audit's own function, called for each live decided sequence)
    and, with a calibration, the noise check and u (each triplet's A/B contrast), one that rests on a flagged A/B
    triplet, does not stop; the rule adds a triplet, and at the maximum stops not decided (the returned veto)."""
    rule = SequentialRule(MAX_TRIPLETS)
    calib = Spread(1.0, CAL_TRIPLETS - 1) if cal is not None else None  # only its presence sets the looks
    levels = {j: rule.nominal_level(j, calib) for j in range(1, MAX_TRIPLETS + 1)}
    n = d.shape[0]
    taken = np.zeros(n, dtype=int)
    why = np.full(n, -1)
    mean, half, veto = np.zeros(n), np.full(n, math.inf), np.zeros(n, bool)
    for k in range(1, MAX_TRIPLETS + 1):
        lk = intervals(d[:, :k], cal, levels[k], noise)
        live = taken == 0
        faster, slower = _judge(lk)
        decided = faster | slower
        held = np.zeros(n, bool)
        for i in np.flatnonzero(live & decided):  # the outlier-triplet check: scalar, on the few decided looks
            c = cal.spread(int(i)) if cal is not None else None
            held[i] = outlier_check("faster" if faster[i] else "slower", list(d[i, :k]), c, rule) is not None
        if cal is not None and noise is not None and u is not None:
            checked = baseline_check(lk, d, u, cal, noise, np.full(n, k), levels).veto
            assert checked is not None
            held |= checked & decided
        bounded = np.isfinite(lk.half)
        precise = bounded & (np.expm1(lk.half) <= TARGET_HALF_WIDTH)
        reason = np.where(decided & ~held, 0, np.where(precise & ~decided, 1, np.where(k == MAX_TRIPLETS, 2, -1)))
        stop = live & (reason >= 0)
        taken[stop], why[stop], mean[stop], half[stop] = k, reason[stop], lk.mean[stop], lk.half[stop]
        veto[stop] = held[stop]
    return Looks(mean, half, veto), taken, why


def cp(k: int, n: int) -> list[float]:
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [float(ci.low), float(ci.high)]


def rule_figures(lk: Looks, taken: np.ndarray, ratio: float, cal_triplets: int) -> dict[str, Any]:
    n = lk.mean.size
    faster, slower = _judge(lk)
    truth = math.log(ratio)
    covers = (lk.mean - lk.half <= truth) & (truth <= lk.mean + lk.half)
    accepts = int(faster.sum() + slower.sum())
    right = int(slower.sum()) if ratio < 1 else int(faster.sum()) if ratio > 1 else 0
    bounded = np.isfinite(lk.half)
    out: dict[str, Any] = {
        "sequences": n, "accepted_faster": int(faster.sum()), "accepted_slower": int(slower.sum()),
        "unbounded": int((~bounded).sum()), "coverage": float(covers.mean()), "coverage_ci95": cp(int(covers.sum()), n),
        "mean_triplets": float(taken.mean()), "calibration_triplets": cal_triplets,
        "median_half_width": float(np.median(np.expm1(lk.half[bounded]))) if bounded.any() else None,
    }  # fmt: skip
    if ratio == 1.0:
        out |= {"false_accept_rate": accepts / n, "false_accept_ci95": cp(accepts, n)}
    else:
        out |= {"power": right / n, "power_ci95": cp(right, n), "wrong_direction": accepts - right}
    return out


def _arms(times: np.ndarray) -> ArmSpread | None:
    """One triplet's step contrasts by the module's function: times [role A/C/B, step]."""
    return arm_spread([{r: list(times[j, MEASURED]) for j, r in enumerate("ACB")}])


def crosscheck(times: np.ndarray, aa: np.ndarray, ratios: np.ndarray, d: np.ndarray, cal_d: np.ndarray,
               calib: Cal, looks: dict[str, tuple[Looks, np.ndarray]], m: int, profile: np.ndarray) -> dict[str, Any]:
    """Judge the first m sequences again with the module's own functions (windows.speedup, triplet_log_speedup,
    noise.triplet_arm_spread with the calibration's step profile, paired_interval, sequential_doc.replay with the
    A/B launch check, decision.window_effects and decide); the largest disagreement (log scale), and every decision
    and every stop must be the same."""
    worst = 0.0
    flags = {"outlier_triplet_k3": 0, "outlier_window_k3": 0, "window_check_k1": 0, "ab_check_k1": 0,
             "ab_held_look_seq": 0, "outlier_held_look_seq": 0}
    for i in range(m):
        sps = []
        for t in range(MAX_TRIPLETS):
            sp = speedup({r: list(times[i, t, j]) for j, r in enumerate("ACB")}, steps=STEPS, warmup=WARMUP,
                         window=WINDOW, drift_bound=0.02)
            sps.append(sp)
            got = [w.ratio for w in sp.windows]
            worst = max(worst, max(abs(math.log(g / r)) for g, r in zip(got, ratios[i, t], strict=True)),
                        abs(triplet_log_speedup(got) - d[i, t]))
        plain = Spread.of(list(cal_d[i]))
        assert plain is not None
        cal = calib.spread(i)
        aa_arms = [_arms(aa[i, t]) for t in range(CAL_TRIPLETS)]
        cal_step = pooled(*(a.aa_step for a in aa_arms if a is not None))
        cal_w = window_spread([list(np.exp(np.log(window_ratios(aa[i:i + 1]))[0, t])) for t in range(CAL_TRIPLETS)])
        prof = StepProfile(tuple(MEASURED), tuple(float(x) for x in profile[i]))
        noise = NoiseEvidence(tuple(triplet_arm_spread(sp, prof) for sp in sps), cal_step)
        about_mean = NoiseEvidence(tuple(_arms(times[i, t]) for t in range(MAX_TRIPLETS)), cal_step)
        for name, (lk, taken) in looks.items():
            if name == BEFORE:  # the rule before issue 52 is no longer ledger/verdict's
                continue
            c = cal if "cal" in name else None
            ns = None if "cal" not in name else about_mean if name == MEAN_RULE else noise
            k = int(taken[i])
            if name.startswith("seq"):  # the audit's own replay of the looks, with the A/B launch check
                rule = SequentialRule(MAX_TRIPLETS)
                replayed = replay(rule, list(d[i]), c, ns, [baseline_disagreement(sp) for sp in sps])
                j, iv = replayed[-1].triplets, replayed[-1].interval
                flags["ab_held_look_seq"] += any(x.held is not None for x in replayed)
                flags["outlier_held_look_seq"] += any(x.outlier is not None for x in replayed)
                if j != k:
                    raise SystemExit(f"cross-check: sequence {i} rule {name} stopped at {j}, the simulation at {k}")
            else:
                iv = verdict_interval(list(d[i, :k]), c, None, ns)
            lo, hi = (lk.mean[i] - lk.half[i], lk.mean[i] + lk.half[i])
            ref = (math.log(iv.low) if iv.low > 0 else -math.inf, math.log(iv.high))
            for a, b in zip((lo, hi), ref, strict=True):
                worst = max(worst, 0.0 if a == b else abs(a - b))
            if ns is not None:  # the window check (K = 1) and the A/B launch check, as the audit decides
                r1 = [list(ratios[i, 0])]
                eff = window_effects(r1, outlier_windows(r1, cal_w), iv, c, cal_w) if k == 1 else []
                us = [baseline_disagreement(sp) for sp in sps[:k]]
                ab = baseline_effects(us, baseline_outliers(us, c), list(d[i, :k]), c,
                                      SequentialRule(MAX_TRIPLETS) if name.startswith("seq") else None, ns)
                # the sequential rule applies the outlier-triplet check at every look (the fixed-K rules here do not:
                # their simulated false accepts bound the audit's from above)
                rule = SequentialRule(MAX_TRIPLETS) if name.startswith("seq") else None
                held = (outlier_effects(list(d[i, :k]), outlier_triplets(list(d[i, :k]), c), c, rule)
                        if rule is not None else [])
                verdict, _, _ = decide(True, iv, outliers=held, windows=eff, baselines=ab)
                faster, slower = _judge(lk)
                flags["window_check_k1"] += bool(eff) and name == "K=1 + cal"
                flags["ab_check_k1"] += bool(ab) and name == "K=1 + cal"
                if (verdict == "accepted") != bool(faster[i] or slower[i]):
                    raise SystemExit(f"cross-check: sequence {i} rule {name}: the audit says {verdict}")
        flags["outlier_triplet_k3"] += bool(outlier_triplets(list(d[i, :3]), cal))
        flags["outlier_window_k3"] += bool(outlier_windows([list(r) for r in ratios[i, :3]], cal_w))
    if worst > 1e-9:
        raise SystemExit(f"cross-check: the vectorized intervals differ from ledger/verdict by {worst:.3g}")
    return {"sequences": m, "max_abs_log_difference": worst,
            "outlier_named_rate": {k: v / m for k, v in flags.items()} if m else None}


def simulate(scenario: Scenario, n: int, seed: int, check: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    base = (np.broadcast_to(ALTERNATING, (n, STEPS)) if scenario.base == "alternating"
            else rng.uniform(0.3, 0.9, size=(n, STEPS)))
    times = step_times(rng, n, MAX_TRIPLETS, scenario.ratio, scenario.host, base)
    ratios = window_ratios(times)
    d = np.log(ratios).mean(axis=-1)
    aa_host = replace(scenario.host, candidate_noise=1.0, candidate_burst=1.0,  # A/A: the candidate arm is the
                      candidate_add_s=0.0)  # baseline
    aa = step_times(rng, n, CAL_TRIPLETS, 1.0, aa_host, base, aa=True)
    aa_logr = np.log(window_ratios(aa))
    cal_d = aa_logr.mean(axis=-1)
    sd = cal_d.std(axis=1, ddof=1)
    calib = Cal(sd, cal_d.mean(axis=1), ab_disagreement(aa).mean(axis=1))
    before = Cal(sd, floor=False)
    cal_w = np.sqrt(((aa_logr - cal_d[..., None]) ** 2).sum((1, 2)) / (CAL_TRIPLETS * (aa_logr.shape[-1] - 1)))
    aa_y, aa_v = contrasts(aa)
    m = len(MEASURED) - 1
    profile = step_profile(aa)
    run_y, run_v = contrasts(times, profile)
    cal_var = (aa_y.sum(1) / 1.5 + aa_v.sum(1) / 2.0) / (CAL_TRIPLETS * 2 * m)
    noise = Noise(run_y, run_v, cal_var)
    about_mean = Noise(contrasts(times)[0], run_v, cal_var, fitted=False)  # before issue 50
    u = ab_disagreement(times)
    looks: dict[str, tuple[Looks, np.ndarray]] = {}
    stops: dict[str, dict[str, int]] = {}
    for name in RULES:
        c = None if "cal" not in name else before if name == BEFORE else calib
        ns = None if c is None else about_mean if name in (BEFORE, MEAN_RULE) else noise
        if name.startswith("seq"):
            lk, taken, why = sequential(d, c, ns, u)  # the A/B launch check inside each look (sequential_doc.look)
            if ns is not None and c is not None:  # a stop at look 1 is a one-triplet run: the window check applies
                first = SequentialRule(MAX_TRIPLETS).nominal_level(1, Spread(1.0, CAL_TRIPLETS - 1))
                checked = window_check(lk, np.log(ratios[:, 0]), c, cal_w, ns, first)
                lk = Looks(lk.mean, lk.half, (checked.veto & (taken == 1)) | lk.veto)  # type: ignore[operator]
            stops[name] = {w: int((why == i).sum()) for i, w in enumerate(("decided", "precise", "maximum"))}
            if lk.veto is not None:
                stops[name]["maximum_held_by_ab_check"] = int((lk.veto & (why == 2)).sum())
        else:
            k = int(name[2])
            lk, taken = intervals(d[:, :k], c, LEVEL, ns), np.full(n, k)
            if k == 1 and c is not None and ns is not None:
                lk = window_check(lk, np.log(ratios[:, 0]), c, cal_w, ns)
            if c is not None and ns is not None:
                lk = baseline_check(lk, d, u, c, ns, taken, dict.fromkeys(range(1, k + 1), LEVEL))
        looks[name] = (lk, taken)
    rules = {name: rule_figures(lk, taken, scenario.truth(), CAL_TRIPLETS if "cal" in name else 0)
             for name, (lk, taken) in looks.items()}
    for name, st in stops.items():
        rules[name]["stops"] = st
    return {"scenario": scenario.name, "ratio": scenario.truth(), "base": scenario.base, "host": asdict(scenario.host),
            "seed": seed, "rules": rules,
            "crosscheck": crosscheck(times, aa, ratios, d, cal_d, calib, looks, check, profile)}
