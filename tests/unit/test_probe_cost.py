"""The probe's cost per step: boundary seconds / step seconds per launch and rank, the digest part split out, the
record write carried by the next line, older records read as a lower bound, the goals judged on the worst median."""

from __future__ import annotations

import pytest

from ledger.probe_cost import GOAL_WITH_DIGESTS, GOAL_WITHOUT_DIGESTS, boundary_costs, probe_cost_doc
from protocol.results import RngFingerprint, StepRecord


def _line(step: int, duration: float, probe: float, digest: float | None = None, prev: float | None = None,
          digests: bool = False) -> StepRecord:  # fmt: skip
    return StepRecord(rank=0, world_size=1, step=step, duration_s=duration, probe_s=probe, lr=[1e-6],
                      rng=RngFingerprint(cpu="0"), digests={"t": "x"} if digests else None, digest_s=digest,
                      prev_boundary_s=prev)  # fmt: skip


def test_a_boundary_costs_its_whole_time_from_the_next_line_else_its_probe_s() -> None:
    lines = [_line(0, 2.0, 0.010, 0.008, None, True), _line(1, 1.0, 0.004, None, 0.012),
             _line(2, 1.0, 0.003, None, 0.005)]
    costs = boundary_costs(lines, n_steps=4)
    assert [c.probe_s for c in costs] == [0.012, 0.005, 0.003]  # step 2's write is unrecorded: probe_s
    assert [c.whole for c in costs] == [True, True, False]
    assert [c.digests for c in costs] == [True, False, False]
    assert costs[0].fraction == pytest.approx(0.006) and costs[0].digest_s == 0.008
    last = boundary_costs([_line(3, 1.0, 0.02)], n_steps=4)[0]
    assert last.digests and last.whole  # the last step digests for the final digests; its stop has no next line


def _launch(duration: float, probe: float, digest: float, write: float) -> list[StepRecord]:
    """16 steps, digests at 0-13 and (final) at 15, each boundary's record write `write` s after probe_s."""
    out = []
    for k in range(16):
        dig = k <= 13 or k == 15
        p = probe + (digest if dig else 0.0)
        prev = None if k == 0 else probe + (digest if (k - 1) <= 13 else 0.0) + write
        out.append(_line(k, duration, p, digest if dig else None, prev, digests=k <= 13))
    return out


def test_fractions_per_launch_and_rank_split_digests_and_judge_the_worst_median() -> None:
    steps = {"A": {0: _launch(1.0, 0.002, 0.010, 0.001)}, "C": {0: _launch(0.5, 0.002, 0.010, 0.001)}}
    doc = probe_cost_doc(steps, n_steps=16, warmup=10)
    assert doc["timed_steps"] == [10, 15] and [(r["launch"], r["rank"]) for r in doc["rows"]] == [("A", 0), ("C", 0)]
    a, c = doc["rows"]
    assert a["with_digests"]["steps"] == [10, 11, 12, 13, 15] and a["without_digests"]["steps"] == [14]
    assert a["with_digests"]["median"] == pytest.approx(0.013)  # (probe + digest + write) / step
    assert a["with_digests"]["digest_median"] == pytest.approx(0.010)
    assert a["with_digests"]["rest_median"] == pytest.approx(0.003)
    assert c["with_digests"]["median"] == pytest.approx(0.026)
    assert c["without_digests"]["median"] == pytest.approx(0.006)
    assert doc["worst_median_with_digests"] == pytest.approx(0.026)
    assert doc["worst_median_without_digests"] == pytest.approx(0.006)
    assert doc["goal_met"] is True
    assert "with digests 2.60% (digest 2.00%, rest 0.60%)" in doc["words"] and "launch C rank 0" in doc["words"]
    assert "lower bound" not in doc["words"]
    slow = probe_cost_doc({"A": {0: _launch(0.25, 0.002, 0.010, 0.001)}}, n_steps=16, warmup=10)
    assert slow["goal_met"] is False and "goal <= 3.00%: missed" in slow["words"]
    assert (GOAL_WITHOUT_DIGESTS, GOAL_WITH_DIGESTS) == (0.01, 0.03)


def test_older_records_without_the_split_read_as_a_lower_bound() -> None:
    old = [_line(k, 1.0, 0.004, digests=k <= 13) for k in range(16)]
    doc = probe_cost_doc({"A": {1: old}}, n_steps=16, warmup=10)
    row = doc["rows"][0]
    assert row["rank"] == 1 and row["with_digests"]["median"] == pytest.approx(0.004)
    assert row["with_digests"]["digest_median"] is None and not row["with_digests"]["whole"]
    assert "lower bound" in doc["words"]
