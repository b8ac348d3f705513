"""Issue 50: before the lock, `orch launch` says what the host's calibration lets the run decide."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

from test_audit import HOST_FINGERPRINT, _protocol, record_calibration
from test_calibrate import RECORDED_HOST

from ledger.cost.store import Ledger
from ledger.verdict.decide.stats import Position, Spread, expected_half_width, triplets_needed
from orchestrator.run.forecast import forecast_line
from protocol.home import resolve_home
from protocol.run_record import HostFingerprint
from protocol.schema import LoadedProtocol

NOW = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _ctx(tmp_path: Path, triplets: int = 1, calibrates: bool = False) -> SimpleNamespace:
    home = resolve_home(tmp_path)
    home.create()
    loaded = LoadedProtocol(protocol=_protocol(), path=tmp_path / "protocol.yaml", base=tmp_path)
    return SimpleNamespace(loaded=loaded, home=home, ledger=Ledger(home.ledger_path),
                           host=HostFingerprint.model_validate(HOST_FINGERPRINT), calibrates=calibrates,
                           shape=(triplets, False))


def test_without_a_calibration_a_one_triplet_run_is_told_it_cannot_be_bounded(tmp_path: Path) -> None:
    line = forecast_line(_ctx(tmp_path), None)
    assert line is not None and line.startswith("forecast: no usable A/A calibration")
    assert "a one-triplet run cannot be bounded" in line and "orch calibrate" in line
    three = forecast_line(_ctx(tmp_path, triplets=3), None)
    assert three is not None and "the run's own spread of 3 triplets alone" in three


def test_the_calibration_the_audit_will_pool_gives_the_width_and_the_k_for_5pct(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    record_calibration(tmp_path, "cal", ctx.loaded.id, RECORDED_HOST, sd=0.0079, df=2, recorded_at=NOW)
    cal = Spread(0.0079, 2, Position(0.0, 0.0, 3))
    width, need = expected_half_width(cal, 1), triplets_needed(0.0079, 2, carried=0.0079**2 / 3)
    assert round(width, 3) == 0.040 and need == 1  # t(2) * 0.0079 * sqrt(1 + 1/3) = 3.9%
    line = forecast_line(ctx, None)
    assert line == ("forecast: this host's calibration (SD 0.0079 of the paired log speedup, df 2, 3 A/A launches) "
                    f"gives about +-{width:.1%} with 1 triplet(s) for a candidate whose steps are as steady as the "
                    "baseline's (a noisier one gets wider); +-5% needs K = 1")
    sequential = forecast_line(ctx, 6)
    assert sequential is not None and f"+-{expected_half_width(cal, 6):.1%} with at most 6 triplet(s)" in sequential


def test_a_host_too_noisy_for_5pct_at_any_k_is_told_to_calibrate_more(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    record_calibration(tmp_path, "cal", ctx.loaded.id, RECORDED_HOST, sd=0.2, df=4, recorded_at=NOW)
    line = forecast_line(ctx, None)
    assert line is not None and "+-5% is out of reach at any K" in line and "known only to +-19.2%" in line


def test_an_expired_calibration_is_not_forecast_from_as_the_audit_would_not_use_it(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    record_calibration(tmp_path, "cal", ctx.loaded.id, RECORDED_HOST, sd=0.0079, df=2)  # recorded in 2025
    line = forecast_line(ctx, None)
    assert line is not None and line.startswith("forecast: no usable A/A calibration")
    assert "measurement.calibration_max_age_days" in line


def test_an_aa_launch_of_orch_calibrate_gets_no_forecast(tmp_path: Path) -> None:
    assert forecast_line(_ctx(tmp_path, calibrates=True), None) is None
