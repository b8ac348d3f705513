"""The verdict's own rules (ledger/verdict/decision.py) on hand-made intervals and step times (issue 18).

Every expected value is worked out by hand from the rule in DESIGN.md section 5, never from the code under test.
"""

from __future__ import annotations

import math

import pytest

from ledger.verdict.decision import (
    decide,
    drift_notes,
    exit_code,
    interval_doc,
    interval_text,
    launch_windows,
    replication_doc,
    triplet_speedups,
    verdict_lines,
)
from ledger.verdict.stats import Interval
from protocol.plan import Triplet


def _iv(low: float, high: float, *, estimate: float = 1.5, df: int = 4, triplets: int | None = 7,
        half_width: float = 0.25) -> Interval:
    return Interval(estimate=estimate, low=low, high=high, level=0.95, method="m", df=df, baseline_launches=4,
                    candidate_launches=2, launch_sd=0.03, launch_level_sd=0.02, window_level_sd=0.01,
                    half_width=half_width, triplets_for_target=triplets)


def test_exit_code_fails_only_a_run_that_is_not_exact() -> None:
    assert exit_code("accepted") == 0
    assert exit_code("no difference shown") == 0
    assert exit_code("not exact") == 1
    assert exit_code("") == 1


def test_decide_names_the_verdict_the_direction_and_the_interval() -> None:
    assert decide(True, _iv(1.2, 1.8)) == (
        "accepted", "faster", "the candidate is faster: the 95% interval [1.2000, 1.8000] of the speedup excludes 1")
    assert decide(True, _iv(0.5, 0.9)) == (
        "accepted", "slower", "the candidate is slower: the 95% interval [0.5000, 0.9000] of the speedup excludes 1")
    assert decide(True, _iv(0.9, 1.1)) == (
        "no difference shown", None, "the 95% interval [0.9000, 1.1000] of the speedup covers 1: no speed difference "
        "is shown")
    # an interval that touches 1 covers it
    assert decide(True, _iv(1.0, 1.3))[:2] == ("no difference shown", None)
    assert decide(True, _iv(0.0, math.inf))[2] == (
        "the 95% interval [0.0000, inf] of the speedup covers 1: no speed difference is shown")
    assert decide(False, _iv(1.2, 1.8)) == (
        "not exact", None, "the candidate does not compute the same bits; its speed is not judged")


def test_launch_windows_sum_each_window_of_the_measured_steps() -> None:
    # 6 steps, warm-up 2, windows of 2: (2, 3) and (4, 5)
    times = {"A1": [9.0, 9.0, 1.0, 2.0, 3.0, 4.0], "C1": [9.0, 9.0, 0.5, 0.25, 1.0, 2.0]}
    assert launch_windows(times, steps=6, warmup=2, window=2) == {"A1": [3.0, 7.0], "C1": [0.75, 3.0]}


def test_interval_doc_words_for_each_width_case() -> None:
    doc = interval_doc(_iv(1.2, 1.8), repeats=2)
    assert doc["words"] == (
        "speedup 1.5000x, 95% interval [1.2000, 1.8000] (4 baseline and 2 candidate launches, df 4); half-width 25.0% "
        "from 2 triplets; about 7 triplet(s) would give a +-5% interval on this host")
    assert (doc["low"], doc["high"], doc["covers_one"], doc["half_width"], doc["triplets_for_5pct"]) == (
        1.2, 1.8, False, 0.25, 7)
    assert doc["variance"] == {"launch_sd": 0.03, "launch_level_sd": 0.02, "window_level_sd": 0.01,
                               "scale": "natural log of window time"}
    assert (doc["estimate"], doc["level"], doc["df"], doc["method"]) == (1.5, 0.95, 4, "m")
    assert (doc["baseline_launches"], doc["candidate_launches"]) == (4, 2)
    one = interval_doc(_iv(0.4, 5.0, df=1, triplets=None), repeats=1)
    assert one["words"].endswith(
        "; one triplet: the interval rests on the spread of the two baseline launches alone (df 1), so it is wide "
        "(half-width 25.0%); set measurement.repeats to narrow it; a +-5% interval is out of reach on this host at "
        "this launch-to-launch spread")
    none = interval_doc(_iv(0.0, math.inf, df=0, triplets=None, half_width=math.inf), repeats=1)
    assert "; no launch-level spread can be estimated from one launch per arm: the interval is unbounded; " in (
        none["words"])
    assert (none["low"], none["high"], none["half_width"], none["covers_one"]) == (0.0, None, None, True)


def test_interval_text_beside_the_headline() -> None:
    assert interval_text({"interval": interval_doc(_iv(1.2, 1.8), 2)}) == ", speedup 1.5000x in [1.2000, 1.8000] (95%)"
    unbounded = interval_doc(_iv(0.0, math.inf, df=0, triplets=None, half_width=math.inf), 1)
    assert interval_text({"interval": unbounded}) == ", speedup 1.5000x in [0.0000, inf] (95%)"
    assert interval_text({"interval": {**unbounded, "low": None}}) == ", speedup 1.5000x in [0, inf] (95%)"
    assert interval_text({}) == ""


def _trip() -> Triplet:
    return Triplet(index=1, a="A1", c="C1", b="B1", order=("A1", "C1", "B1"))


def test_drift_notes_name_a_drift_above_the_bound_only() -> None:
    # 4 steps, warm-up 2, one window (2, 3): A = 2 s, B = 3 s, C = 1 s -> drift |2 - 3| / 2.5 = 0.4, ratio 2.5
    times = {"A1": [1.0, 1.0, 1.0, 1.0], "C1": [1.0, 1.0, 0.5, 0.5], "B1": [1.0, 1.0, 1.5, 1.5]}
    sps = triplet_speedups(times, [_trip()], steps=4, warmup=2, window=2, drift_bound=0.5)
    assert [w.ratio for w in sps[0].windows] == [2.5]
    assert drift_notes([_trip()], sps, 0.5) == []
    assert drift_notes([_trip()], sps, 0.4) == []  # a drift at the bound is within it (1 / 2.5 is 0.4 in floats)
    assert drift_notes([_trip()], sps, 0.3) == [
        "drift above the protocol's bound: window w1 A/B drift 0.4000 > 0.3 (the two baseline launches disagree; it "
        "enters the interval as launch-level variance)"]
    second = Triplet(index=2, a="A2", c="C2", b="B2", order=("A2", "C2", "B2"))
    notes = drift_notes([_trip(), second], [sps[0], sps[0]], 0.3)
    # one speedup per triplet: a list that lost one is refused, not silently shortened
    with pytest.raises(ValueError):
        drift_notes([_trip(), second], sps, 0.3)
    with pytest.raises(ValueError):
        replication_doc([_trip(), second], sps)
    assert [n.split(" A/B")[0] for n in notes] == ["drift above the protocol's bound: triplet 1 window w1",
                                                   "drift above the protocol's bound: triplet 2 window w1"]


def test_verdict_lines_list_the_interval_the_triplets_and_the_context() -> None:
    doc = {
        "interval": interval_doc(_iv(1.2, 1.8), 2),
        "replication": {"triplets": [{"index": 1, "order": ["A1", "C1", "B1"], "headline": 1.25,
                                      "headline_window": "w2", "ratios": [1.5, 1.25], "max_drift": 0.125}]},
        "diagnostics": ["d1"],
        "quiet_host": {"words": "quiet"},
        "clock": {"words": "clock steady"},
        "calibration": {"words": "calibrated"},
    }
    lines = verdict_lines(doc)
    assert lines == [
        f"interval: {doc['interval']['words']}",
        "method: m",
        "variance components (log scale): launch level SD 0.0200, window level SD 0.0100, SD of a launch's mean "
        "0.0300",
        "triplet 1 (A1 C1 B1): headline 1.2500x (w2; window ratios 1.5000 / 1.2500), max A/B drift 0.1250",
        "d1",
        "calibration: calibrated",
        "clock: clock steady",
        "quiet host: quiet",
    ]
    assert verdict_lines({"clock": {"words": ""}, "calibration": {"note": "x"}}) == []
    assert verdict_lines({}) == []


def test_replication_doc_records_each_triplet_as_computed_by_hand() -> None:
    # two windows (2, 3) and (4, 5): A 2 and 2, C 1 and 2, B 2 and 2 -> ratios 2.0 and 1.0, headline 1.0 in w2
    times = {"A1": [1.0] * 6, "C1": [1.0, 1.0, 0.5, 0.5, 1.0, 1.0], "B1": [1.0] * 6}
    sps = triplet_speedups(times, [_trip()], steps=6, warmup=2, window=2, drift_bound=0.5)
    assert replication_doc([_trip()], sps) == {
        "repeats": 1,
        "triplets": [{"index": 1, "order": ["A1", "C1", "B1"], "labels": {"A": "A1", "C": "C1", "B": "B1"},
                      "headline": 1.0, "headline_window": "w2", "ratios": [2.0, 1.0], "drifts": [0.0, 0.0],
                      "max_drift": 0.0}],
        "headlines": [1.0],
    }
