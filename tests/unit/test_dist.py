"""ledger/verdict/decide/dist.py returns what scipy.stats' t, f and norm return, bit for bit (the sign of a zero and
every NaN's place included), over the verdict's domain and beyond it; and `orch launch`'s module no longer imports
scipy.stats when it starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from ledger.verdict.decide import dist

REPO = Path(__file__).resolve().parents[2]

# probabilities: the verdict's levels and tail areas, the quadrature's and Sobol's points, the ends and beyond them
PROB = st.one_of(st.floats(0.0, 1.0), st.sampled_from([0.0, 1.0, 0.5, 0.975, 0.025, 1e-300, 1 - 1e-16, -0.1, 1.1]))
# degrees of freedom: the verdict's (0.05 to 1e7: calibrations' df, equivalent_df's bracket) and invalid ones
DF = st.one_of(st.floats(0.05, 1e7), st.sampled_from([1.0, 2.0, 0.05, 1e7, 0.0, -1.0, np.inf]))
X = st.one_of(st.floats(-60.0, 60.0), st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-300]))


def _same(ours: object, theirs: object) -> None:
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    assert a.shape == b.shape
    assert np.array_equal(np.isnan(a), np.isnan(b)), (a, b)
    keep = ~np.isnan(a)
    assert np.array_equal(a[keep], b[keep]), (a, b)
    assert np.array_equal(np.signbit(a[keep]), np.signbit(b[keep])), (a, b)


@settings(max_examples=300, deadline=None)
@given(q=PROB, df=DF, x=X)
def test_student_t_equals_scipy_stats(q: float, df: float, x: float) -> None:
    _same(dist.t_ppf(q, df), sps.t.ppf(q, df))
    _same(dist.t_isf(q, df), sps.t.isf(q, df))
    _same(dist.t_cdf(x, df), sps.t.cdf(x, df))
    _same(dist.t_sf(x, df), sps.t.sf(x, df))


@settings(max_examples=300, deadline=None)
@given(q=PROB, d1=DF, d2=DF, x=st.one_of(st.floats(0.0, 1e4), X))
def test_f_equals_scipy_stats(q: float, d1: float, d2: float, x: float) -> None:
    _same(dist.f_ppf(q, d1, d2), sps.f.ppf(q, d1, d2))
    _same(dist.f_sf(x, d1, d2), sps.f.sf(x, d1, d2))


@settings(max_examples=300, deadline=None)
@given(q=PROB, x=X, scale=st.floats(1e-3, 1e3))
def test_normal_equals_scipy_stats(q: float, x: float, scale: float) -> None:
    _same(dist.norm_ppf(q), sps.norm.ppf(q))
    _same(dist.norm_cdf(x), sps.norm.cdf(x))
    _same(dist.norm_sf(x), sps.norm.sf(x))
    _same(dist.norm_pdf(x), sps.norm.pdf(x))
    _same(dist.norm_pdf(x, scale=scale), sps.norm.pdf(x, scale=scale))


def test_arrays_as_the_verdict_passes_them() -> None:
    """The shapes the verdict uses: F quantiles at Gauss-Legendre points, t probabilities over an array, normal
    probabilities and densities over a grid and a 2-D difference of grids, normal quantiles of Sobol points."""
    from scipy.stats import qmc

    x, _ = np.polynomial.legendre.leggauss(400)
    u = (x + 1.0) / 2.0
    _same(dist.f_ppf(u, 3.0, 28.0), sps.f.ppf(u, 3.0, 28.0))
    root_f = np.sqrt(sps.f.ppf(u, 3.0, 28.0))
    _same(dist.t_cdf(2.1 * root_f, 1.0), sps.t.cdf(2.1 * root_f, 1.0))
    grid = np.linspace(-7.5, 7.5, 1201)
    _same(dist.norm_cdf(-2.0 - grid), sps.norm.cdf(-2.0 - grid))
    _same(dist.norm_sf(2.0 - grid), sps.norm.sf(2.0 - grid))
    _same(dist.norm_pdf(grid, scale=np.sqrt(2.0)), sps.norm.pdf(grid, scale=np.sqrt(2.0)))
    _same(dist.norm_pdf(grid[:, None] - grid[None, ::7]), sps.norm.pdf(grid[:, None] - grid[None, ::7]))
    points = qmc.Sobol(d=5, scramble=True, seed=34).random_base2(10)
    _same(dist.norm_ppf(points), sps.norm.ppf(points))


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan")])
def test_normal_density_refuses_a_scale_that_is_not_positive(scale: float) -> None:
    with pytest.raises(ValueError, match="scale > 0"):
        dist.norm_pdf(0.0, scale=scale)


def test_orch_launch_starts_without_scipy_stats_or_optimize() -> None:
    """What the move is for: `orch launch` and `orch audit` import the verdict at start; scipy.stats (and
    scipy.optimize, needed only with a calibration or a sequential stop) are imported where they are used."""
    code = ("import sys, orchestrator.run.launch, orchestrator.run.calibrate, ledger.verdict.documents.audit; "
            "print(sorted(m for m in sys.modules if m.startswith(('scipy.stats', 'scipy.optimize'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
