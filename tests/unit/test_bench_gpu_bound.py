"""bench/gpu_bound.py spends a device session's scarce time: after the calibration it skips a known slowdown that this
host's calibration cannot tell from nothing (issue 50: on an H100 whose calibration read SD 0.041 over 3 A/A launches,
a K = 1 launch of the 5% slowdown took 464 s and read [0.68, 1.35]), and still runs it where it can decide."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from benchutil import bench_module


@pytest.fixture(scope="module")
def out_of_reach() -> Callable[[dict[str, Any] | None, float | None, int], str | None]:
    return bench_module("gpu_bound").out_of_reach  # type: ignore[no-any-return]


def _cal(sd: float, repeats: int = 3) -> dict[str, Any]:
    return {"sd": sd, "df": repeats - 1, "repeats": repeats, "mean_log_speedup": -0.01}


def test_a_noisy_hosts_calibration_skips_the_5pct_and_the_2pct(out_of_reach: Any) -> None:
    why = out_of_reach(_cal(0.041), 0.05, 1)
    assert why is not None and "+-22.6% at K = 1" in why and "5% slowdown" in why
    assert out_of_reach(_cal(0.041), 0.02, 4) is not None


def test_a_quiet_hosts_calibration_runs_both(out_of_reach: Any) -> None:
    # SD 0.0079 (an H100 of 2026-12-07): K = 1 gives +-4.0% < 5%, K = 4 gives +-1.6% < 2%
    assert out_of_reach(_cal(0.0079), 0.05, 1) is None and out_of_reach(_cal(0.0079), 0.02, 4) is None
    assert out_of_reach(_cal(0.0079), 0.02, 1) is not None  # but not 2% at K = 1


def test_the_null_the_candidate_and_an_uncalibrated_host_always_run(out_of_reach: Any) -> None:
    assert out_of_reach(_cal(0.5), None, 1) is None
    assert out_of_reach(None, 0.05, 1) is None and out_of_reach({"sd": 0.1, "df": 0}, 0.05, 1) is None
