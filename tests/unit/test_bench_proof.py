"""bench/bench_proof.py's decision line (issue 51's goal): a calibration's A/A launches on a kept cache plus one run
of the protocol that loaded it, against that run's timed triplet; the A/A launch that primed a cold host counts
without its prime."""

from __future__ import annotations

import math
from typing import Any

import pytest
from benchutil import bench_module


@pytest.fixture(scope="module")
def bench() -> Any:
    return bench_module("bench_proof")


def _row(run_id: str, timed: float, proof: dict[str, float], aa: bool, reused: bool) -> dict[str, Any]:
    return {"run_id": run_id, "calibration": aa, "compile_cache": {"reused": reused}, "timed_gpu_seconds": timed,
            "by_kind": proof, "total_gpu_seconds": timed + sum(proof.values())}


def test_the_decision_counts_each_aa_launch_without_its_prime_and_the_latest_kept_run(bench: Any) -> None:
    rows = [
        _row("cold", 321.8, {"checks": 6.4, "prime": 284.7, "reload": 15.0, "replay": 83.0, "score": 5.4}, False,
             False),
        _row("aa1", 280.0, {"checks": 3.0, "prime": 250.0, "reload": 8.0}, True, False),  # primed a cold host
        _row("aa2", 279.0, {"checks": 3.2, "reload": 8.2}, True, True),
        _row("kept", 279.1, {"checks": 3.2, "reload": 12.3, "replay": 99.3, "score": 9.3}, False, True),
    ]
    cost = bench.decision_cost(rows)
    assert cost["aa_runs"] == ["aa1", "aa2"] and math.isclose(cost["aa_gpu_seconds"], 291.0 + 290.4)
    assert [round(x, 4) for x in cost["aa_of_timed"]] == [round(291.0 / 280.0, 4), round(290.4 / 279.0, 4)]
    assert cost["run"] == "kept" and math.isclose(cost["run_gpu_seconds"], 403.2)
    assert math.isclose(cost["of_timed"], (291.0 + 290.4 + 403.2) / 279.1)
    line = bench.decision_line(cost)
    assert line.startswith("decision on a kept cache: 2 A/A launch(es) 581.4 GPU-s without their primes (1.04x, "
                           "1.04x of each one's timed triplet) + run kept 403.2 GPU-s = 984.6 GPU-s, 3.53x")


def test_without_a_kept_run_the_line_says_so_and_without_a_gpu_aa_launch_there_is_none(bench: Any) -> None:
    cold = _row("cold", 300.0, {"prime": 250.0, "replay": 80.0}, False, False)
    only_aa = bench.decision_cost([cold, _row("aa1", 200.0, {"prime": 100.0, "reload": 10.0}, True, False)])
    assert only_aa["run"] is None and only_aa["of_timed"] is None and only_aa["aa_gpu_seconds"] == 210.0
    assert bench.decision_line(only_aa).endswith("; no run of the protocol loaded a kept cache in this home")
    assert bench.decision_cost([cold]) is None
    assert bench.decision_cost([cold, _row("aa1", 0.0, {"reload": 0.0}, True, False)]) is None  # a CPU protocol
