"""The outlier-triplet check inside a sequential look (issue 34): the launch's stopping rule (sequential_doc.look)
applies the audit's own test (decision.outlier_check, the function decide's outlier effects come from), so a launch
never stops 'decided' at a look whose decision the audit takes back because it rests on an outlier triplet."""

from __future__ import annotations

import pytest

from ledger.verdict.decide import sequential_doc
from ledger.verdict.decide.decision import (
    NO_DIFFERENCE,
    OutlierEffect,
    decide,
    deciding_outlier,
    outlier_check,
    outlier_effects,
)
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import integrity, look, replay
from ledger.verdict.decide.stats import Outlier, Spread, outlier_triplets

CAL = Spread(0.02, 4)
TIGHT_WITH_OUTLIER = [0.05, 0.05, 0.05, 0.05, 0.05, 0.30]  # triplet 6 stands apart; the other five decide faster


def test_outlier_check_returns_the_outlier_a_decision_rests_on_and_none_otherwise() -> None:
    rule = SequentialRule(max_triplets=6)
    d = TIGHT_WITH_OUTLIER
    flagged = outlier_triplets(d, CAL)
    assert [o.triplet for o in flagged] == [5]
    # without triplet 6 the rule's interval still decides faster: a 'faster' decision does not rest on it ...
    assert outlier_check("faster", d, CAL, rule) is None
    # ... a 'slower' one would (the interval without it does not say slower), and none is asked for no decision
    held = outlier_check("slower", d, CAL, rule)
    assert held is not None and held.outlier.triplet == 5 and held.without.low > 1.0
    assert outlier_check(None, d, CAL, rule) is None
    # the same effects the audit computes (document.py), the same first one
    effects = outlier_effects(d, flagged, CAL, rule)
    assert deciding_outlier("slower", effects) == held and deciding_outlier("faster", effects) is None
    assert deciding_outlier(None, effects) is None
    assert outlier_check("faster", [0.05, 0.06], None, rule) is None  # two triplets, no calibration: none flagged


def _resting(d: list[float], triplet: int) -> OutlierEffect:
    """An outlier effect whose interval without the triplet covers 1 (the decision rests on it)."""
    rule = SequentialRule(max_triplets=6)
    without = rule.interval([x for i, x in enumerate(d) if i != triplet] or [0.0], CAL, None)
    wide = without.__class__(**{**without.__dict__, "low": 0.9, "high": 1.1})
    return OutlierEffect(Outlier(triplet, None, 6.0, 1e-4, 4.0), wide)


@pytest.mark.parametrize("max_triplets, stop", [(6, None), (2, "maximum")])
def test_a_look_whose_decision_rests_on_an_outlier_triplet_does_not_stop_decided(
        max_triplets: int, stop: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    rule = SequentialRule(max_triplets=max_triplets)
    d = [0.20, 0.21]
    assert rule.stop(rule.interval(d, CAL, None)) == "decided"
    asked: list[tuple[str | None, list[float]]] = []

    def resting(direction: str | None, dd: list[float], cal: Spread | None, r: SequentialRule) -> OutlierEffect:
        asked.append((direction, list(dd)))
        return _resting(dd, 1)

    monkeypatch.setattr(sequential_doc, "outlier_check", resting)
    held = look(rule, d, CAL)
    assert held is not None and held.stop == stop and held.outlier is not None and held.held is None
    assert asked == [("faster", d)]  # asked with the look's own direction and triplets
    words = held.words(max_triplets)
    assert "excludes 1 only with triplet 2, an outlier (z = 6.00; without it [0.9000, 1.1000])" in words
    assert ("stop at the maximum of 2 triplets, not decided" in words if stop == "maximum"
            else "not decided, add triplet 3 of at most 6" in words)
    # the audit's decision at that look says the same: not decided, the outlier named
    verdict, _, sentence = decide(True, held.interval, outliers=[held.outlier])
    assert verdict == NO_DIFFERENCE and "only with triplet 2, an outlier" in sentence
    if stop is None:  # a launch that had stopped there stopped earlier than its rule
        ok, why = integrity(rule, 2, replay(rule, d, CAL), 1)
        assert not ok and "stopped earlier than its rule" in why


def test_a_look_with_no_outlier_to_rest_on_stops_decided_as_before() -> None:
    rule = SequentialRule(max_triplets=6)
    d = [0.10, 0.10, 0.10, 0.18]  # triplet 4 is flagged, but the three others decide faster without it
    assert [o.triplet for o in outlier_triplets(d, CAL)] == [3]
    lk = look(rule, d, CAL)
    assert lk is not None and lk.stop == "decided" and lk.outlier is None and lk.held is None
    assert "stop, decided faster" in lk.words(6)
