"""The A/B launch check inside a sequential look (issue 34): the stopping rule the launch follows (orch launch's
after_triplet) and the rule the audit replays (sequential_doc.replay, integrity) are the same function, so a launch
never stops 'decided' at a look whose decision the audit refuses because it rests on a flagged A/B triplet; the
simulation's vectorized rule stops where the audit's replay stops.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from benchutil import bench_module

from ledger.verdict.decide.decision import NO_DIFFERENCE, baseline_effects, decide
from ledger.verdict.decide.noise import NoiseEvidence, baseline_outliers
from ledger.verdict.decide.sequential import SequentialRule
from ledger.verdict.decide.sequential_doc import integrity, look, replay, sequential_doc
from ledger.verdict.decide.stats import Spread
from orchestrator.run import sequential_launch
from orchestrator.run.sequential_launch import SequentialState, after_triplet
from protocol.schema import Measurement
from protocol.sequential_run import SequentialRecord

CAL = Spread(0.02, 4)  # the calibration's between-launch SD of d
STEP = Spread(0.01, 50)  # its baseline step spread: the checks of issue 34 apply
# triplet 1's baseline launches disagree by exp(0.3) (z about 13 against 0.02 sqrt(4/3)); the others agree
HELD_THEN_DECIDED = ([0.30, 0.29], [0.3, 0.0])  # without triplet 1, triplet 2 alone still decides faster
HELD_AT_MAXIMUM = ([0.10, 0.06], [0.3, 0.0])  # both decide faster at look 2; triplet 2 alone does not


def _noise(k: int) -> NoiseEvidence:
    return NoiseEvidence((None,) * k, STEP)


def test_a_look_that_rests_on_a_flagged_ab_triplet_adds_a_triplet() -> None:
    rule = SequentialRule(max_triplets=6)
    d, us = HELD_THEN_DECIDED
    iv = rule.interval(d[:1], CAL, _noise(2))
    assert rule.stop(iv) == "decided"  # what the look said before: stop, decided at one triplet
    first = look(rule, d[:1], CAL, _noise(2), us)
    assert first is not None and first.stop is None and first.held is not None
    assert first.held.outlier.triplet == 0 and first.held.without is None
    assert "decision rests on it: not decided, add triplet 2 of at most 6" in first.words(6)
    looks = replay(rule, d, CAL, _noise(2), us)
    assert [(lk.triplets, lk.stop) for lk in looks] == [(1, None), (2, "decided")]
    assert looks[-1].held is None and looks[-1].interval.low > 1.0
    # the audit: a run that stopped at one triplet stopped earlier than its rule; one that took two is where it stops
    assert integrity(rule, 2, looks, 1)[0]
    ok, words = integrity(rule, 1, replay(rule, d[:1], CAL, _noise(2), us), 1)
    assert not ok and "stopped earlier than its rule" in words
    # and the audit's decision at two triplets stands: triplet 2 alone decides the same way
    eff = baseline_effects(us, baseline_outliers(us, CAL), d, CAL, rule, _noise(2))
    assert decide(True, looks[-1].interval, baselines=eff)[:2] == ("accepted", "faster")


def test_at_the_maximum_a_held_look_stops_and_the_audit_says_not_decided() -> None:
    rule = SequentialRule(max_triplets=2)
    d, us = HELD_AT_MAXIMUM
    looks = replay(rule, d, CAL, _noise(2), us)
    assert [(lk.triplets, lk.stop) for lk in looks] == [(1, None), (2, "maximum")]
    last = looks[-1]
    assert rule.stop(last.interval) == "decided" and last.held is not None  # the old look stopped 'decided' here
    assert last.held.without is not None and last.held.without.covers_one
    assert "stop at the maximum of 2 triplets, not decided" in last.words(2)
    eff = baseline_effects(us, baseline_outliers(us, CAL), d, CAL, rule, _noise(2))
    verdict, _, words = decide(True, last.interval, baselines=eff)
    assert verdict == NO_DIFFERENCE and "one triplet does not decide" in words
    doc = sequential_doc(rule, "protocol", d, CAL, {}, noise=_noise(2), ab=us)
    assert doc["integrity"]["ok"] and doc["stop"] == "maximum" and doc["rule_triplets"] == 2


def test_the_check_applies_only_with_a_calibrated_step_spread_and_needs_the_ab_contrasts() -> None:
    rule = SequentialRule(max_triplets=6)
    d, us = HELD_THEN_DECIDED
    old = NoiseEvidence((None,), None)  # a calibration recorded before issue 34: as before
    one = look(rule, d[:1], CAL, old, us)
    assert one is not None and one.stop == "decided"
    with pytest.raises(ValueError, match="A/B contrast"):
        look(rule, d[:1], CAL, _noise(1))


def _state(rule: SequentialRule) -> SequentialState:
    record = SequentialRecord(asked="protocol", max_triplets=rule.max_triplets,
                              target_half_width=rule.target_half_width, level=rule.level)
    return SequentialState(rule, record, calibration=CAL, calibration_step=STEP, calibration_words="the test's")


@pytest.mark.parametrize("run, max_triplets", [(HELD_THEN_DECIDED, 6), (HELD_AT_MAXIMUM, 2)])
def test_the_launch_stops_where_the_audit_replays_it(run: tuple[list[float], list[float]], max_triplets: int,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    d, us = run
    rule = SequentialRule(max_triplets=max_triplets)
    recorded: list[Any] = []
    ctx = SimpleNamespace(loaded=SimpleNamespace(protocol=SimpleNamespace(measurement=Measurement())),
                          run_dir=Path("unused"), sequential=_state(rule),
                          update_run=lambda **kw: recorded.append(kw["sequential"]))
    monkeypatch.setattr(sequential_launch, "triplet_d",
                        lambda _dir, _m, t, _profile: (d[t.index - 1], None, us[t.index - 1]))
    while ctx.sequential.stop is None:
        after_triplet(ctx)  # type: ignore[arg-type]
    seq = ctx.sequential.record
    again = replay(rule, d[:seq.triplets], CAL, _noise(seq.triplets), us)
    assert [(lk.triplets, lk.stop) for lk in seq.looks] == [(lk.triplets, lk.stop) for lk in again]
    assert seq.triplets == len(d) and seq.looks[0].stop is None  # look 1 rests on triplet 1: a triplet was added
    doc = sequential_doc(rule, "protocol", d, CAL, {}, seq, noise=_noise(len(d)), ab=us)
    assert doc["integrity"]["ok"], doc["integrity"]["words"]
    # a run.json of the launch before the fix (stopped 'decided' at look 1) is named by the audit
    before = seq.model_copy(update={"looks": [seq.looks[0].model_copy(update={"stop": "decided"})], "triplets": 1,
                                    "stop": "decided"})
    bad = sequential_doc(rule, "protocol", d[:1], CAL, {}, before, noise=_noise(1), ab=us[:1])
    assert not bad["integrity"]["ok"] and "stopped earlier than its rule" in bad["integrity"]["words"]


def test_the_simulations_rule_stops_where_the_audits_replay_does() -> None:
    """bench/verdict_sim.py's vectorized rule with the A/B launch check at each look against sequential_doc.replay
    (its cross-check raises SystemExit on any difference in the stop or the decision); a quiet host with a 25 %
    slowdown has A/B-held looks in about a fifth of its sequences."""
    sim = bench_module("verdict_sim")
    scenario = next(s for s in sim.SCENARIOS if s.name == "25% slowdown, quiet host")
    out = sim.simulate(scenario, 400, 34, 40)
    assert out["crosscheck"]["outlier_named_rate"]["ab_held_look_seq"] > 0
    assert "maximum_held_by_ab_check" in out["rules"]["seq<=6 + cal"]["stops"]
    d = np.full((1, sim.MAX_TRIPLETS), 0.3)
    u = np.full((1, sim.MAX_TRIPLETS), 1.0)  # flagged everywhere, but no calibration: the check does not apply
    assert sim.sequential(d + np.linspace(0, 0.01, sim.MAX_TRIPLETS), None, None, u)[2][0] == 0  # decided
