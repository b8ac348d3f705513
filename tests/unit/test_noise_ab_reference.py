"""The A/B launch check judged against the calibration's own A/B disagreements (issue 34): a drift in launch position
enters u, not d, so the reference is the A/A launches' u (noise.ABReference), not the calibration's SD of d."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ledger.verdict.calibration import Calibration, calibration_ab_log_ratios, read_calibration
from ledger.verdict.decision import NO_DIFFERENCE, baseline_effects, decide, verdict_interval
from ledger.verdict.interval_doc import interval_doc
from ledger.verdict.noise import (
    ABReference,
    NoiseEvidence,
    aa_disagreement,
    ab_log_ratio,
    baseline_disagreement,
    baseline_outliers,
    launch_oriented,
    triplet_arm_spread,
)
from ledger.verdict.stats import Spread
from ledger.verdict.windows import speedup

POSITIONS = np.array([0.0, 1.0, 2.0])  # A C B: launch positions of a calibration launch and a run's first triplet


def _drifting_us(rng: np.random.Generator, n: int, launches: int, drift: float = 0.02, drift_sd: float = 0.04,
                 tau: float = 0.015, sigma: float = 0.02, windows: int = 3, steps: int = 2) -> np.ndarray:
    """u of n x launches triplets launched A C B on a quiet drifting host (the simulation's QUIET): log time of a
    step = launch effect (SD tau) + drift x position (drift ~ N(drift, drift_sd) per triplet) + step noise (SD
    sigma); u from each window's summed A and B times by the module's ab_log_ratio."""
    out = np.empty((n, launches))
    lam = rng.normal(0.0, tau, size=(n, launches, 3)) + rng.normal(drift, drift_sd, size=(n, launches, 1)) * POSITIONS
    eps = rng.normal(0.0, sigma, size=(n, launches, 3, windows, steps))
    win = np.exp(lam[..., None, None] + eps).sum(-1)  # [n, launches, role, window]
    for i in range(n):
        for j in range(launches):
            out[i, j] = ab_log_ratio(zip(win[i, j, 0], win[i, j, 2], strict=True))
    return out


def test_on_a_drifting_host_the_calibration_u_holds_5pct_and_the_sd_of_d_does_not() -> None:
    # u has mean -2 drift (A two positions before B) and the drift's spread; d cancels both: the SD of d of a quiet
    # calibration (tau 0.015: about 0.02) is far below u's (about 0.08)
    rng = np.random.default_rng(34)
    n = 2000
    cal_u = _drifting_us(rng, n, 5)
    run_u = _drifting_us(rng, n, 1)[:, 0]
    assert float(np.mean(run_u)) == pytest.approx(-0.04, abs=0.006)
    cal_d = Spread(math.sqrt(1.5) * 0.015, 4)  # the calibration's SD of d on this host (launch terms only)
    new = sum(bool(baseline_outliers([float(u)], cal_d, reference=ABReference.of(list(c))))
              for u, c in zip(run_u, cal_u, strict=True)) / n
    old = sum(bool(baseline_outliers([float(u)], cal_d)) for u in run_u) / n
    assert new == pytest.approx(0.05, abs=0.015)  # 4 binomial SDs at n = 2000 is 0.0195
    assert old > 0.5  # the older reference refuses most clean triplets of this host


def test_even_triplets_are_launched_b_first_so_their_u_is_oriented() -> None:
    # plan: triplet 1 A C B, triplet 2 B C A: the same drift reads +u in one and -u in the other
    assert launch_oriented([0.04, -0.04, 0.04]) == [0.04, 0.04, 0.04]
    ref = ABReference.of([0.035, 0.045, 0.04, 0.038, 0.042])
    assert ref is not None and ref.mean == pytest.approx(0.04) and ref.df == 4
    assert baseline_outliers([0.04, -0.04], None, reference=ref) == []
    flagged = baseline_outliers([0.04, 0.04], None, reference=ref)  # triplet 2 read unoriented: 0.08 from the mean
    assert [o.triplet for o in flagged] == [1] and flagged[0].df == 4
    assert flagged[0].z == pytest.approx(-0.08 / (ref.sd * math.sqrt(1.2)))
    assert ABReference.of([0.01]) is None and ABReference.of([0.01, 0.01]) is None and ABReference.of(None) is None


def _k1(a_factor: float) -> tuple[list[float], list[float], NoiseEvidence, Spread]:
    """A quiet host with a steady drift, the candidate truly 1.3x faster; baseline launch A slowed by a_factor;
    the calibration's five A/A launches' u drawn from the same host."""
    rng = np.random.default_rng(7)
    ref = ABReference.of(list(_drifting_us(rng, 1, 5, drift_sd=0.005)[0]))
    times = {}
    for pos, role in enumerate("ACB"):
        times[role] = list(np.exp(0.01 * rng.normal() + 0.02 * pos + 0.01 * rng.normal(size=16)))
    times["C"] = [x / 1.3 for x in times["C"]]
    times["A"] = [x * a_factor for x in times["A"]]
    sp = speedup(times, steps=16, warmup=10, window=2, drift_bound=0.02)
    d = [float(np.mean(np.log([w.ratio for w in sp.windows])))]
    noise = NoiseEvidence((triplet_arm_spread(sp),), Spread(0.01, 50), ref)
    return [baseline_disagreement(sp)], d, noise, Spread(0.02, 4)


def test_a_whole_launch_a_outlier_is_still_flagged_named_and_keeps_k1_from_deciding() -> None:
    us, d, noise, cal = _k1(1.4)
    flagged = baseline_outliers(us, cal, reference=noise.ab_reference)
    assert [o.triplet for o in flagged] == [0] and flagged[0].z > 5
    eff = baseline_effects(us, flagged, d, cal, None, noise)
    iv = verdict_interval(d, cal, None, noise)
    assert not iv.covers_one
    verdict, _, words = decide(True, iv, baselines=eff, triplet_names=["1"])
    assert verdict == NO_DIFFERENCE and "baseline launches A and B of triplet 1 disagree" in words
    doc = interval_doc(iv, headlines=[1.0], calibration_run="cal", window_spread=None, outlier_triplets=[],
                       outlier_windows=[], triplet_index=[1], calibration=cal, baseline_check=(us, eff),
                       ab_reference=noise.ab_reference)
    block = doc["baseline_check"]
    assert block["reference"] == "calibration A/B disagreements" and block["factor"] is None
    assert block["calibration_ab"]["n"] == 5 and block["triplets"][0]["triplet"] == 1
    assert "triplet 1's A/B = " in block["words"] and "the calibration's own A/B disagreements (n = 5" in block["words"]
    assert "the host's drift between a triplet's first and last launch" in doc["words"]
    # without the slow launch the drifting host's triplet agrees with its calibration: accepted
    us, d, noise, cal = _k1(1.0)
    assert baseline_outliers(us, cal, reference=noise.ab_reference) == []
    assert decide(True, verdict_interval(d, cal, None, noise))[:2] == ("accepted", "faster")


def _old_record() -> bytes:
    """An orch.calibration/2 recorded before the A/B disagreements were (step_sd, no ab_log_ratios)."""
    cal = Calibration(
        run_id="cal", of_protocol_id="p" * 64, of_protocol_name="x", aa_protocol_id="0" * 64, host={"host_hash": "h"},
        repeats=5, headlines=[1.0] * 5, log_speedups=[0.02, -0.02, 0.01, -0.01, 0.0], sd=0.0158, df=4,
        step_sd=0.01, step_df=50, mean_log_speedup=0.0, estimate=1.0, low=0.98, high=1.02, level=0.95,
        triplets_for_5pct=1, recorded_at="2026-01-01T00:00:00Z")
    data = cal.model_dump(mode="json", by_alias=True)
    del data["ab_log_ratios"]
    return json.dumps(data).encode()


def test_an_old_calibration_without_u_is_read_and_the_older_rule_says_so() -> None:
    cal = read_calibration(_old_record())
    assert isinstance(cal, Calibration) and cal.ab_log_ratios is None
    block = {"usable": True, "sd": cal.sd, "df": cal.df}  # find_calibration's block of it: no ab_log_ratios key
    assert calibration_ab_log_ratios(block) is None and ABReference.of(calibration_ab_log_ratios(block)) is None
    assert calibration_ab_log_ratios({"usable": True, "ab_log_ratios": [0.1, 0.2]}) == [0.1, 0.2]
    us, d, noise, spread = _k1(1.4)
    old = NoiseEvidence(noise.triplets, noise.calibration_step)  # what the audit builds from such a block
    flagged = baseline_outliers(us, spread, reference=old.ab_reference)
    assert flagged and flagged[0].df == 4 and flagged[0].z == pytest.approx(us[0] / (0.02 * math.sqrt(4 / 3)))
    eff = baseline_effects(us, flagged, d, spread, None, old)
    doc = interval_doc(verdict_interval(d, spread, None, old), headlines=[1.0], calibration_run="cal",
                       window_spread=None, outlier_triplets=[], outlier_windows=[], triplet_index=[1],
                       calibration=spread, baseline_check=(us, eff), ab_reference=None)
    block = doc["baseline_check"]
    assert block["reference"] == "calibration SD of d" and block["factor"] == 4 / 3 and block["calibration_ab"] is None
    assert "calibrated between-launch SD 0.0200 x sqrt(4/3) (df 4" in block["words"]
    assert "records no A/B disagreements of its own launches" in block["words"]
    assert "re-run orch calibrate to record the baseline launches' disagreement" in doc["words"]


def test_aa_disagreement_reads_the_audit_speedup_block_as_baseline_disagreement() -> None:
    rng = np.random.default_rng(3)
    times = {r: list(np.exp(0.05 * rng.normal(size=16))) for r in "ACB"}
    sp = speedup(times, steps=16, warmup=10, window=2, drift_bound=0.02)
    block = {"windows": [{"A": w.a, "C": w.c, "B": w.b} for w in sp.windows]}
    assert aa_disagreement(block) == baseline_disagreement(sp)
    assert aa_disagreement({}) is None


def test_the_launch_finds_the_reference_and_its_looks_judge_against_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # a host whose baseline launches drift: every A/A launch read A/B about exp(0.3); the run's triplet 1 (A C B)
    # reads the same, triplet 2 (B C A) the opposite: nothing stands apart from the calibration, so look 1 decides;
    # the older reference (0.02 sqrt(4/3)) would have held it
    from types import SimpleNamespace

    from ledger.verdict.sequential import SequentialRule
    from ledger.verdict.sequential_doc import look
    from orchestrator import sequential_launch
    from orchestrator.sequential_launch import SequentialState, after_triplet
    from protocol.schema import Measurement
    from protocol.sequential_run import SequentialRecord

    cal, step = Spread(0.02, 4), Spread(0.01, 50)
    block = {"found": True, "usable": True, "run_id": "cal", "sd": 0.02, "df": 4, "step_sd": 0.01, "step_df": 50,
             "ab_log_ratios": [0.29, 0.31, 0.30, 0.295, 0.305]}
    monkeypatch.setattr(sequential_launch, "find_calibration", lambda *_: block)
    rule = SequentialRule(max_triplets=6)
    record = SequentialRecord(asked="protocol", max_triplets=6, target_half_width=rule.target_half_width,
                              level=rule.level)
    ctx = SimpleNamespace(loaded=SimpleNamespace(id="p", protocol=SimpleNamespace(measurement=Measurement())),
                          run_id="run", run_dir=None, home=SimpleNamespace(runs=None),
                          ledger=SimpleNamespace(records=lambda *_: []), host=SimpleNamespace(model_dump=dict),
                          sequential=SequentialState(rule, record), update_run=lambda **_: None)
    monkeypatch.setattr(sequential_launch, "baseline_workload_id", lambda _: None)
    monkeypatch.setattr(sequential_launch, "triplet_d", lambda _dir, _m, t: (0.30, None, 0.30))
    one = after_triplet(ctx)  # type: ignore[arg-type]
    state = ctx.sequential
    assert state.ab_reference == ABReference.of(block["ab_log_ratios"])
    assert one is not None and one.stop == "decided" and one.held is None
    old = look(rule, [0.30], cal, NoiseEvidence((None,), step), [0.30])  # a calibration without u's
    assert old is not None and old.stop is None and old.held is not None
    ref = ABReference.of(block["ab_log_ratios"])
    two = look(rule, [0.05, 0.04], cal, NoiseEvidence((None, None), step, ref), [0.30, -0.30])
    assert two is not None and two.held is None
