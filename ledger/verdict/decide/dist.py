"""The distributions the verdict reads (Student t, F, standard normal), as the scipy.special functions that
scipy.stats' t, f and norm call for them (scipy/stats/_continuous_distns.py), without importing scipy.stats: with
scipy.optimize, which it imports, about 0.5 s of every `orch launch`, `orch audit` and `orch calibrate` start (both
are now imported only where a calibration or a sequential stop needs them).

Each function returns what the scipy.stats method returns at loc 0 and scale 1, bit for bit. The method evaluates
the same special function inside the distribution's support, applies its location and scale there (`* 1 + 0` on a
quantile, which turns -0.0 into 0.0), and sets the rest by rule (rv_continuous's cdf, sf, ppf, isf): NaN for an
invalid shape (df <= 0) or a NaN argument; a probability of 0 or 1 outside the open support; a quantile's bound at q
= 0 and 1 (where stdtrit alone returns +inf at q = 0) and NaN beyond. Those rules are repeated here, and
tests/unit/test_dist.py checks the equality inside and outside the verdict's domain.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import special as sc

_NORM_PDF_C = np.sqrt(2 * np.pi)  # scipy.stats' _norm_pdf_C
_INF = math.inf


def _probability(raw: np.ndarray, x: ArrayLike, valid: np.ndarray, lo: float, hi: float, below: float,
                 above: float) -> np.ndarray:
    """rv_continuous.cdf / sf around the special function's value `raw`: NaN for invalid shapes or a NaN x, `below` at
    x <= lo and `above` at x >= hi (the support's ends), `raw` inside."""
    x = np.asarray(x, dtype=float)
    inside = np.where(x <= lo, below, np.where(x >= hi, above, raw))
    return np.asarray(np.where(valid & ~np.isnan(x), inside, np.nan))


def _quantile(raw: np.ndarray, q: ArrayLike, valid: np.ndarray, at0: float, at1: float) -> np.ndarray:
    """rv_continuous.ppf / isf around the special function's quantile `raw`: the support's bound at q = 0 and q = 1,
    `raw * 1 + 0` for 0 < q < 1, NaN for an invalid shape and for any other q."""
    q = np.asarray(q, dtype=float)
    inner = np.where((q > 0) & (q < 1), raw * 1 + 0, np.nan)
    return np.asarray(np.where(valid, np.where(q == 0, at0, np.where(q == 1, at1, inner)), np.nan))


def _t_valid(df: ArrayLike) -> np.ndarray:
    return np.asarray(np.asarray(df, dtype=float) > 0)


def _f_valid(dfn: ArrayLike, dfd: ArrayLike) -> np.ndarray:
    return np.asarray((np.asarray(dfn, dtype=float) > 0) & (np.asarray(dfd, dtype=float) > 0))


def t_ppf(q: ArrayLike, df: ArrayLike) -> np.ndarray:
    """scipy.stats.t.ppf(q, df)."""
    return _quantile(np.asarray(sc.stdtrit(df, q)), q, _t_valid(df), -_INF, _INF)


def t_isf(q: ArrayLike, df: ArrayLike) -> np.ndarray:
    """scipy.stats.t.isf(q, df)."""
    return _quantile(-np.asarray(sc.stdtrit(df, q)), q, _t_valid(df), _INF, -_INF)


def t_cdf(x: ArrayLike, df: ArrayLike) -> np.ndarray:
    """scipy.stats.t.cdf(x, df)."""
    return _probability(np.asarray(sc.stdtr(df, x)), x, _t_valid(df), -_INF, _INF, 0.0, 1.0)


def t_sf(x: ArrayLike, df: ArrayLike) -> np.ndarray:
    """scipy.stats.t.sf(x, df)."""
    raw = np.asarray(sc.stdtr(df, -np.asarray(x, dtype=float)))
    return _probability(raw, x, _t_valid(df), -_INF, _INF, 1.0, 0.0)


def f_ppf(q: ArrayLike, dfn: ArrayLike, dfd: ArrayLike) -> np.ndarray:
    """scipy.stats.f.ppf(q, dfn, dfd)."""
    return _quantile(np.asarray(sc.fdtri(dfn, dfd, q)), q, _f_valid(dfn, dfd), 0.0, _INF)


def f_sf(x: ArrayLike, dfn: ArrayLike, dfd: ArrayLike) -> np.ndarray:
    """scipy.stats.f.sf(x, dfn, dfd)."""
    return _probability(np.asarray(sc.fdtrc(dfn, dfd, x)), x, _f_valid(dfn, dfd), 0.0, _INF, 1.0, 0.0)


def norm_ppf(q: ArrayLike) -> np.ndarray:
    """scipy.stats.norm.ppf(q)."""
    return _quantile(np.asarray(sc.ndtri(q)), q, np.asarray(True), -_INF, _INF)


def norm_cdf(x: ArrayLike) -> np.ndarray:
    """scipy.stats.norm.cdf(x)."""
    return _probability(np.asarray(sc.ndtr(x)), x, np.asarray(True), -_INF, _INF, 0.0, 1.0)


def norm_sf(x: ArrayLike) -> np.ndarray:
    """scipy.stats.norm.sf(x)."""
    return _probability(np.asarray(sc.ndtr(-np.asarray(x, dtype=float))), x, np.asarray(True), -_INF, _INF, 1.0, 0.0)


def norm_pdf(x: ArrayLike, scale: float = 1.0) -> np.ndarray:
    """scipy.stats.norm.pdf(x, scale=scale), scale > 0 (the normal's support is the whole line: no rule to add)."""
    if not scale > 0:
        raise ValueError(f"norm_pdf needs scale > 0, got {scale}")
    z = np.asarray(x, dtype=float) / scale
    # on a 1-D array, as scipy.stats evaluates it: numpy's exp of a 0-D array can differ in the last bit
    flat = np.atleast_1d(z).ravel()
    return np.asarray(np.exp(-(flat**2) / 2.0) / _NORM_PDF_C / scale).reshape(z.shape)
