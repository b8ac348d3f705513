"""The verdict's own rules (ledger/verdict/decide/decision.py, interval_doc.py) on hand-made intervals and step times.

Every expected value is worked out by hand from the rule in DESIGN.md section 5, never from the code under test.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from ledger.verdict.decide.decision import (
    HOW_TO_BOUND,
    OutlierEffect,
    decide,
    drift_notes,
    exit_code,
    log_speedups,
    outlier_effects,
    outlier_notes,
    replication_doc,
    triplet_speedups,
    verdict_interval,
    window_ratios,
)
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import sequential_doc
from ledger.verdict.decide.stats import Interval, Outlier, Spread, SpreadCheck, paired_interval
from ledger.verdict.documents.interval_doc import audit_note, interval_doc, interval_text, verdict_lines
from protocol.plan import Triplet


def _iv(low: float, high: float, *, estimate: float = 1.5, sd: float | None = 0.1, df: int = 4, triplets: int = 2,
        source: str = "pooled", check: SpreadCheck | None = None, target: int | None = 7) -> Interval:
    return Interval(estimate=estimate, low=low, high=high, level=0.95, nominal_level=0.95, method="m",
                    triplets=triplets, log_speedups=(math.log(1.4), math.log(1.6))[:triplets], sd=sd, df=df,
                    variance_source=source, critical=2.0 if sd is not None else None, check=check,
                    triplets_for_target=target)


UNBOUNDED = _iv(0.0, math.inf, sd=None, df=0, triplets=1, source="none", target=None)


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
    assert decide(True, _iv(1.0, 1.3))[:2] == ("no difference shown", None)  # touching 1 covers it
    assert decide(False, _iv(1.2, 1.8)) == (
        "not exact", None, "the candidate does not compute the same bits; its speed is not judged")


def test_an_interval_without_a_calibration_is_never_accepted() -> None:
    """Issue 52: C is the middle launch in both orders, so a position effect is the same in every triplet; only an
    A/A calibration measures it. An interval from the run's own triplets alone never decides."""
    verdict, direction, sentence = decide(True, _iv(1.2, 1.8, source="run"))
    assert (verdict, direction) == ("no difference shown", None)
    assert sentence == (
        "the 95% interval [1.2000, 1.8000] excludes 1, but no usable A/A calibration of this protocol on this host: C "
        "is always the middle launch, so without one a launch-position effect cannot be told apart from a speed "
        "difference (docs/validation/VERDICT.md, issue 52); run `orch calibrate`, then audit again")
    assert decide(True, _iv(0.9, 1.1, source="run"))[2].endswith("covers 1: no speed difference is shown")
    assert decide(True, _iv(1.2, 1.8, source="calibration"))[0] == "accepted"
    check = SpreadCheck(Spread(0.3, 1), Spread(0.01, 4), 900.0, 1e-5, True)  # a calibration, its spread not used
    assert decide(True, _iv(1.2, 1.8, source="run", check=check))[0] == "accepted"


def test_a_baseline_launch_that_compiled_what_a_shortened_prime_did_not_reach_keeps_the_run_undecided() -> None:
    said = "train-A compiled or tuned what the prime's 2 of 16 steps did not reach: 3 compiled artifact(s)"
    assert decide(True, _iv(1.2, 1.8), unprimed=[said]) == (
        "no difference shown", None, f"the 95% interval [1.2000, 1.8000] excludes 1, but {said}: their steps may hold "
        "compile time; raise measurement.prime_steps, or remove it so that the prime runs every step")
    assert decide(True, _iv(0.9, 1.1), unprimed=[said])[2].endswith("covers 1: no speed difference is shown")
    assert decide(False, _iv(1.2, 1.8), unprimed=[said])[0] == "not exact"  # exactness is judged first
    two = decide(True, _iv(1.2, 1.8), unprimed=["train-A compiled", "train-B tuned"])[2]
    assert "excludes 1, but train-A compiled; train-B tuned: their steps may hold compile time" in two


def test_one_triplet_without_a_calibration_cannot_be_bounded_and_says_what_to_run() -> None:
    verdict, direction, sentence = decide(True, UNBOUNDED)
    assert (verdict, direction) == ("no difference shown", None)
    assert sentence == (
        "the speedup cannot be bounded yet: 1 triplet and no usable A/A calibration of this protocol on this host; "
        "run `orch calibrate PROTOCOL` on this host (A/A launches measure the spread between launches), or set "
        "measurement.repeats >= 2 (or auto)")
    assert decide(False, UNBOUNDED)[0] == "not exact"  # exactness is judged first
    # the real interval of one triplet without a calibration is this unbounded one
    iv = paired_interval([math.log(3.7)])
    assert not iv.bounded and decide(True, iv)[2].startswith("the speedup cannot be bounded yet")


def test_a_busy_window_named_by_the_host_watch_keeps_an_excluding_interval_from_being_accepted() -> None:
    busy = ["train-C1 w2 (steps 12-13): foreign processes used 80% of the busiest rank's cores"]
    verdict, direction, sentence = decide(True, _iv(1.2, 1.8), busy)
    assert (verdict, direction) == ("no difference shown", None)
    assert sentence == (
        "the 95% interval [1.2000, 1.8000] excludes 1, but the host watch names busy window(s): train-C1 w2 (steps "
        "12-13): foreign processes used 80% of the busiest rank's cores; not accepted from a busy host: re-run when "
        "it is quiet")
    # a busy host does not turn an interval that covers 1 into anything else
    assert decide(True, _iv(0.9, 1.1), busy)[2].endswith("covers 1: no speed difference is shown")


def test_an_outlier_triplet_that_decides_makes_no_difference_shown_naming_it_and_its_z() -> None:
    out = Outlier(triplet=2, window=None, z=4.25, p_value=0.001, df=6)
    deciding = OutlierEffect(out, _iv(0.95, 1.4))
    verdict, direction, sentence = decide(True, _iv(1.2, 1.8), (), [deciding], ["1", "2", "3"])
    assert (verdict, direction) == ("no difference shown", None)
    assert sentence == (
        "the 95% interval [1.2000, 1.8000] excludes 1 only with triplet 3, an outlier (z = 4.25): without it the "
        "interval is [0.9500, 1.4000]; one triplet does not decide")
    # without it the interval is unbounded: that also differs
    assert decide(True, _iv(1.2, 1.8), (), [OutlierEffect(out, UNBOUNDED)])[0] == "no difference shown"
    # without it the run says slower: differs too
    assert decide(True, _iv(1.2, 1.8), (), [OutlierEffect(out, _iv(0.5, 0.8))])[0] == "no difference shown"
    # an outlier whose removal leaves the same decision is a diagnostic only
    assert decide(True, _iv(1.2, 1.8), (), [OutlierEffect(out, _iv(1.1, 1.3))])[:2] == ("accepted", "faster")


def test_outlier_effects_recompute_the_same_rule_without_the_flagged_triplet() -> None:
    d = [0.1, 0.12, 0.5]
    out = Outlier(triplet=2, window=None, z=5.0, p_value=1e-4, df=4)
    cal = Spread(0.02, 4)
    (eff,) = outlier_effects(d, [out], cal, None)
    assert eff.without.log_speedups == (0.1, 0.12) and eff.without == paired_interval([0.1, 0.12], cal)
    rule = SequentialRule(max_triplets=6)
    (seq,) = outlier_effects(d, [out], cal, rule)
    assert seq.without == rule.interval([0.1, 0.12], cal) and seq.without.nominal_level > 0.95


def test_verdict_interval_is_the_rules_repeated_interval_when_there_is_a_rule() -> None:
    d, cal = [0.2, 0.25], Spread(0.05, 4)
    assert verdict_interval(d, cal, None) == paired_interval(d, cal)
    rule = SequentialRule(max_triplets=5)
    seq = verdict_interval(d, cal, rule)
    assert seq == rule.interval(d, cal) and seq.high - seq.low > paired_interval(d, cal).high - paired_interval(
        d, cal).low


def _trip(i: int = 1) -> Triplet:
    return Triplet(index=i, a=f"A{i}", c=f"C{i}", b=f"B{i}", order=(f"A{i}", f"C{i}", f"B{i}"))


def test_log_speedups_average_the_log_of_each_window_ratio() -> None:
    # two windows (2, 3) and (4, 5): A 2 and 2, C 1 and 4, B 2 and 2 -> ratios 2.0 and 0.5: d = (ln 2 - ln 2) / 2 = 0
    times = {"A1": [1.0] * 6, "C1": [1.0, 1.0, 0.5, 0.5, 2.0, 2.0], "B1": [1.0] * 6}
    sps = triplet_speedups(times, [_trip()], steps=6, warmup=2, window=2, drift_bound=0.5)
    assert window_ratios(sps) == [[2.0, 0.5]]
    assert log_speedups(sps) == [0.0]


def test_replication_doc_records_each_triplet_with_its_headline_and_paired_speedup() -> None:
    # ratios 2.0 and 1.0, headline 1.0 in w2; d = ln 2 / 2, paired speedup sqrt(2)
    times = {"A1": [1.0] * 6, "C1": [1.0, 1.0, 0.5, 0.5, 1.0, 1.0], "B1": [1.0] * 6}
    sps = triplet_speedups(times, [_trip()], steps=6, warmup=2, window=2, drift_bound=0.5)
    doc = replication_doc([_trip()], sps)
    assert doc == {
        "repeats": 1,
        "triplets": [{"index": 1, "order": ["A1", "C1", "B1"], "labels": {"A": "A1", "C": "C1", "B": "B1"},
                      "headline": 1.0, "headline_window": "w2", "ratios": [2.0, 1.0], "drifts": [0.0, 0.0],
                      "max_drift": 0.0, "log_speedup": pytest.approx(math.log(2) / 2),
                      "paired_speedup": pytest.approx(math.sqrt(2))}],
        "headlines": [1.0],
        "paired_speedups": [pytest.approx(math.sqrt(2))],
    }
    with pytest.raises(ValueError):  # one speedup per triplet: a list that lost one is refused
        replication_doc([_trip(), _trip(2)], sps)


def test_drift_notes_name_a_drift_above_the_bound_only() -> None:
    # 4 steps, warm-up 2, one window (2, 3): A = 2 s, B = 3 s, C = 1 s -> drift |2 - 3| / 2.5 = 0.4, ratio 2.5
    times = {"A1": [1.0, 1.0, 1.0, 1.0], "C1": [1.0, 1.0, 0.5, 0.5], "B1": [1.0, 1.0, 1.5, 1.5]}
    sps = triplet_speedups(times, [_trip()], steps=4, warmup=2, window=2, drift_bound=0.5)
    assert drift_notes([_trip()], sps, 0.4) == []  # a drift at the bound is within it
    assert drift_notes([_trip()], sps, 0.3) == [
        "drift above the protocol's bound: window w1 A/B drift 0.4000 > 0.3 (the two baseline launches disagree; the "
        "paired ratio uses their mean, and drift that differs between triplets widens the interval)"]
    notes = drift_notes([_trip(), _trip(2)], [sps[0], sps[0]], 0.3)
    assert [n.split(" A/B")[0] for n in notes] == ["drift above the protocol's bound: triplet 1 window w1",
                                                   "drift above the protocol's bound: triplet 2 window w1"]


def test_outlier_notes_name_the_triplet_and_the_window() -> None:
    trips = [_trip(1), _trip(2)]
    notes = outlier_notes(trips, [Outlier(1, None, -3.5, 0.004, 5)], [Outlier(0, 2, 3.25, 0.0012, 4)],
                          ["w1", "w2", "w3"])
    assert notes == [
        "outlier triplet 2: its paired log speedup stands apart from the others (z = -3.50, df 5, p = 0.004 before "
        "the Bonferroni correction)",
        "outlier window: triplet 1 window w3 stands apart from its triplet's other windows (z = 3.25, df 4, p = "
        "0.0012 before the Bonferroni correction)",
    ]


def _doc(iv: Interval, **kw: object) -> dict[str, object]:
    args: dict[str, object] = {"headlines": [1.3, 1.5][:iv.triplets], "calibration_run": "cal1",
                               "window_spread": Spread(0.01, 4), "outlier_triplets": [], "outlier_windows": [],
                               "triplet_index": [1, 2][:iv.triplets]}
    args.update(kw)
    return interval_doc(iv, **args)  # type: ignore[arg-type]


def test_interval_doc_words_for_each_variance_source() -> None:
    pooled = _doc(_iv(1.2, 1.8, sd=0.05, df=5, source="pooled"), calibration=Spread(0.04, 4))
    assert pooled["words"] == (
        "speedup 1.5000x, 95% interval [1.2000, 1.8000] (paired over 2 triplet(s); SD 0.0500 of the per-triplet log "
        "speedup, df 5, from the run's triplets pooled with A/A calibration run cal1); half-width 22.5%; about 7 "
        "triplet(s) would give a +-5% interval at this spread")
    assert pooled["calibration_used"] == {"run_id": "cal1", "sd": 0.04, "df": 4}
    assert (pooled["low"], pooled["high"], pooled["half_width"], pooled["bounded"], pooled["covers_one"]) == (
        1.2, 1.8, pytest.approx(math.sqrt(1.5) - 1), True, False)
    assert pooled["headlines"] == [1.3, 1.5] and pooled["window_spread"] == {"sd": 0.01, "df": 4}
    assert pooled["paired_speedups"] == [pytest.approx(1.4), pytest.approx(1.6)] and pooled["sequential"] is None
    alone = _doc(_iv(1.2, 1.8, triplets=1, source="calibration", target=None), calibration=Spread(0.1, 4))
    assert "from A/A calibration run cal1 alone (one triplet has no spread of its own)" in alone["words"]
    assert alone["words"].endswith("; a +-5% interval is out of reach at this spread")
    own = _doc(_iv(1.2, 1.8, source="run"), calibration_run=None)
    assert "from the run's own triplets (no usable calibration)" in own["words"] and own["calibration_used"] is None
    check = SpreadCheck(Spread(0.3, 1), Spread(0.01, 4), 900.0, 1e-5, True)
    larger = _doc(_iv(0.8, 2.8, source="run", check=check))
    assert "from the run's own triplets (their spread is larger than the calibration's, which is not used)" in (
        larger["words"])
    assert larger["spread_check"]["larger"] is True and larger["spread_check"]["words"].endswith(
        "; the interval falls back to the run's own spread")
    assert larger["calibration_used"] is None


def _seq_block(rule: SequentialRule, d: list[float], cal: Spread) -> dict[str, Any]:
    # GPU-seconds of each triplet's train and reload packages: 10 per package, 60 per triplet
    gpu = {f"{kind}-{role}{k}": 10.0 for k in range(1, len(d) + 1) for role in "ACB" for kind in ("train", "reload")}
    return sequential_doc(rule, "protocol", d, cal, gpu)


def test_interval_doc_of_an_unbounded_run_and_of_a_sequential_rule() -> None:
    none = _doc(UNBOUNDED, calibration_run=None)
    assert none["words"] == f"speedup 1.5000x, not bounded: 1 triplet and no usable A/A calibration of this " \
                            f"protocol on this host; {HOW_TO_BOUND}"
    assert (none["low"], none["high"], none["half_width"], none["sd"], none["bounded"]) == (
        None, None, None, None, False)
    rule, cal = SequentialRule(max_triplets=6), Spread(0.05, 4)
    iv = rule.interval([0.3], cal)  # 0.3 +- t x 0.05 excludes 0: the rule stops at its first look, decided
    doc = _doc(iv, calibration=cal, rule=rule, sequential=_seq_block(rule, [0.3], cal))
    assert doc["sequential"] == {"rule": rule.words, "max_triplets": 6, "target_half_width": 0.05, "first_look": 1,
                                 "triplets": 1, "stop": "decided", "gpu_seconds": 60.0, "integrity": True}
    assert f"; repeated interval at look 1 of at most 6 (nominal level {iv.nominal_level:.4%} at this look)" in (
        doc["words"]) and doc["method"].endswith(rule.words)
    # a second triplet after the rule stopped: the block says so
    late = _seq_block(rule, [0.3, 0.32], cal)
    assert late["integrity"]["ok"] is False
    assert _doc(rule.interval([0.3, 0.32], cal), rule=rule, sequential=late)["sequential"]["integrity"] is False


def test_interval_text_beside_the_headline() -> None:
    assert interval_text({"interval": _doc(_iv(1.2, 1.8))}) == ", speedup 1.5000x in [1.2000, 1.8000] (95%)"
    assert interval_text({"interval": _doc(UNBOUNDED)}) == ", speedup 1.5000x, not bounded yet"
    # an orch.audit/1 interval as recorded
    assert interval_text({"interval": {"estimate": 1.5, "low": None, "high": None, "level": 0.95}}) == (
        ", speedup 1.5000x in [0, inf] (95%)")
    assert interval_text({}) == ""


def test_verdict_lines_of_a_paired_audit() -> None:
    iv = _doc(_iv(1.2, 1.8, check=SpreadCheck(Spread(0.1, 1), Spread(0.08, 4), 1.5625, 0.28, False)))
    doc = {
        "interval": iv,
        "replication": {"triplets": [{"index": 1, "order": ["A1", "C1", "B1"], "headline": 1.25,
                                      "headline_window": "w2", "ratios": [1.5, 1.25], "max_drift": 0.125,
                                      "paired_speedup": 1.3693}]},
        "diagnostics": ["d1"],
        "quiet_host": {"words": "quiet"},
        "clock": {"words": "clock steady"},
        "calibration": {"words": "calibrated"},
        "host_watch": {"words": "no busy window"},
    }
    assert verdict_lines(doc) == [
        f"interval: {iv['words']}",
        "method: m",
        f"spread check: {iv['spread_check']['words']}",
        "within-triplet SD between windows (log scale): 0.0100 (df 4)",
        "triplet 1 (A1 C1 B1): paired speedup 1.3693x, headline 1.2500x (w2; window ratios 1.5000 / 1.2500), max "
        "A/B drift 0.1250",
        "d1",
        "calibration: calibrated",
        "clock: clock steady",
        "quiet host: quiet",
        "host watch: no busy window",
    ]
    assert verdict_lines({"clock": {"words": ""}, "calibration": {"note": "x"}}) == []
    assert verdict_lines({}) == []


def test_verdict_lines_of_an_audit_recorded_before_paired_statistics() -> None:
    legacy = {"words": "w", "method": "unpaired", "estimate": 3.5, "low": 0.7, "high": 18.6, "level": 0.95,
              "variance": {"launch_sd": 0.106, "launch_level_sd": 0.1038, "window_level_sd": 0.0364}}
    assert verdict_lines({"interval": legacy}) == [
        "interval: w", "method: unpaired",
        "variance components (log scale): launch level SD 0.1038, window level SD 0.0364, SD of a launch's mean "
        "0.1060"]


def test_the_sequential_lines_say_the_rule_the_looks_the_stop_and_the_cost() -> None:
    rule, cal = SequentialRule(max_triplets=6), Spread(0.05, 4)
    block = _seq_block(rule, [0.3], cal)
    lines = verdict_lines({"interval": _doc(rule.interval([0.3], cal), rule=rule, sequential=block),
                           "sequential": block})
    assert f"sequential: {block['words']}" in lines and block["words"].startswith(rule.words)
    assert "Took 1 triplet(s), stopped: decided; the decision cost 60.0 GPU-seconds of triplets" in block["words"]
    assert lines[lines.index(f"sequential: {block['words']}") + 1].startswith("  look 1: speedup 1.3499x")


def test_a_sequential_run_that_did_not_stop_where_its_rule_stops_is_not_accepted() -> None:
    why = "the rule stops after triplet 1 (decided) but the run took 2: it went on after its rule stopped"
    assert decide(True, _iv(1.2, 1.8), stopping=why) == (
        "no difference shown", None, f"the 95% interval [1.2000, 1.8000] excludes 1, but {why}")
    assert decide(True, _iv(1.2, 1.8), stopping=None)[0] == "accepted"


def test_the_ledger_note_carries_verdict_interval_triplets_and_source() -> None:
    doc = {"verdict": "accepted", "direction": "faster",
           "interval": _doc(_iv(1.2, 1.8, sd=0.05, df=5, source="pooled"), calibration=Spread(0.04, 4))}
    assert audit_note(doc) == "verdict: accepted (faster); speedup 1.5000x [1.2000, 1.8000] 95%, K=2, df 5, SD " \
                              "pooled with A/A run cal1"
    run = {**doc["interval"], "variance_source": "run", "calibration_used": None}
    assert audit_note({**doc, "interval": run}).endswith("K=2, df 5, SD of the run's triplets")
    assert audit_note({"verdict": "no difference shown", "interval": _doc(UNBOUNDED)}) == (
        "verdict: no difference shown; speedup 1.5000x not bounded (1 triplet, no calibration)")
    assert audit_note({"verdict": "not exact", "interval": {"variance": {}}}) == "verdict: not exact"
    assert audit_note({**doc, "verdict": "not exact", "direction": None}) == "verdict: not exact"
    long = {**doc["interval"], "calibration_used": {"run_id": "x" * 300}}
    assert len(audit_note({**doc, "interval": long})) == 200
