"""`orch calibrate`: the A/A protocol, the calibration record, and which audits may show it (same host, same id).

The matching and pooling rules on fabricated runs and ledgers (the real A/A runs: tests/e2e/test_hf_trainer_user.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from test_audit import (
    HOST_FINGERPRINT,
    RunSpec,
    aa_log_speedups,
    make_run,
    record_calibration,
    synthetic_protocol_id,
)

from ledger.cost.store import Ledger
from ledger.verdict.decide.calibration import CALIBRATION_FILE, CalibrationV1, find_calibration
from ledger.verdict.decide.stats import Spread
from ledger.verdict.documents.audit import audit_run
from orchestrator.run.calibrate import DEFAULT_REPEATS, aa_protocol, calibrate, launches_asked
from protocol.errors import UsageError
from protocol.home import resolve_home
from protocol.schema import Protocol, baseline_workload_id, load_protocol

RECORDED_HOST = {k: str(v) for k, v in HOST_FINGERPRINT.items()}  # a calibration records the fingerprint as text

REPO = Path(__file__).resolve().parents[2]


def test_aa_protocol_puts_the_baseline_in_both_arms_one_triplet_per_launch_five_launches_by_default() -> None:
    loaded = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    aa = aa_protocol(loaded)
    assert aa.protocol.arms.candidate == aa.protocol.arms.baseline == loaded.protocol.arms.baseline
    assert aa.protocol.measurement.repeats == 1 and aa.protocol.name == "r3-mini-cpu2-aa"
    assert aa.id != loaded.id and aa.protocol.recipe == loaded.protocol.recipe
    assert baseline_workload_id(aa.protocol) == baseline_workload_id(loaded.protocol)
    assert launches_asked(None) == DEFAULT_REPEATS == 5 and launches_asked(3) == 3


def test_a_calibration_of_one_triplet_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        calibrate(REPO / "protocol" / "r3_mini.yaml", 1, tmp_path / "home")
    assert err.value.message == (
        "--repeats 1: an A/A calibration needs at least 2 launches to measure the spread between launches; give "
        "--repeats 2 or more (default 5)")
    assert not (tmp_path / "home").exists()


def _record_calibration(home: Path, run_id: str, protocol_id: str, host: dict[str, str], **over: object) -> Path:
    return record_calibration(home, run_id, protocol_id, host, **over)


def _synthetic_protocol_id(tmp_path: Path) -> str:
    probe = make_run(tmp_path / "probe")  # the fabricated runs share one protocol
    pid = str(json.loads((probe / "run.json").read_text())["protocol_id"])
    assert pid == synthetic_protocol_id()
    return pid


def test_aa_log_speedups_have_the_sd_asked_for() -> None:
    for sd, df in ((0.05, 4), (0.03, 5), (0.1, 1)):
        d = aa_log_speedups(sd, df)
        assert len(d) == df + 1 and Spread.of(d) == Spread(pytest.approx(sd), df)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("other", "shown"),
    [
        ({}, True),
        ({"host_hash": "f" * 64}, False),  # another host (its salted hash)
        ({"torch": "2.99.0"}, False),  # this host after an upgrade: another fingerprint
        ({"protocol_id": "e" * 64}, False),  # another workload
    ],
)
def test_a_later_audit_shows_only_a_calibration_of_this_host_and_protocol(
    tmp_path: Path, other: dict[str, str], shown: bool
) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    host = RECORDED_HOST
    recorded_host = {**host, **{k: v for k, v in other.items() if k != "protocol_id"}}
    _record_calibration(tmp_path, "cal1", other.get("protocol_id", pid), recorded_host)
    make_run(tmp_path, "run1")
    block = audit_run(tmp_path, "run1").document["calibration"]
    assert block["found"] is shown, block
    if shown:
        assert block["run_id"] == "cal1" and block["usable"] and block["covers_one"]
        assert (block["sd"], block["df"], block["schema"]) == (0.05, 4, "orch.calibration/2")
        assert block["words"].startswith("A/A run cal1 on this host (5 triplets): null headlines ")
        assert "; between-triplet SD 0.0500 of the paired log speedup (df 4), within-triplet window SD 0.0200 " \
               "(df 10); A/A mean 1.0000x in [0.9500, 1.0500] (95%), which covers 1" in block["words"]
        assert "calibration: A/A run cal1" in (tmp_path / "runs" / "run1" / "audit.md").read_text()
    elif "torch" in other:
        assert "host fingerprint differs (torch)" in block["words"]
    else:
        assert "none recorded for this protocol on this host before this run" in block["words"]


def test_a_calibration_recorded_after_the_run_or_altered_is_not_used(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    make_run(tmp_path, "run1")
    _record_calibration(tmp_path, "cal-late", pid, RECORDED_HOST)
    assert audit_run(tmp_path, "run1").document["calibration"]["found"] is False
    cal_dir = _record_calibration(tmp_path, "cal2", pid, RECORDED_HOST)
    make_run(tmp_path, "run2")
    (cal_dir / CALIBRATION_FILE).write_text((cal_dir / CALIBRATION_FILE).read_text().replace("0.05", "0.06"))
    block = audit_run(tmp_path, "run2").document["calibration"]
    assert block["found"] is True and block["run_id"] == "cal-late"  # the altered, later one is passed over
    late = tmp_path / "runs" / "cal-late" / CALIBRATION_FILE
    late.write_text(late.read_text().replace("1.05", "1.06"))
    make_run(tmp_path, "run3")
    block = audit_run(tmp_path, "run3").document["calibration"]
    assert block["found"] is False and "run cal2: calibration.json does not hash to its ledger record" in block["words"]
    assert "run cal-late: calibration.json does not hash to its ledger record" in block["words"]


def _run_with(d: list[float]) -> RunSpec:
    """K = len(d) triplets whose candidate launches make every window ratio exp(d_k) exactly."""
    durations = {"A": [0.2] * 16, "B": [0.2] * 16, "C": [0.1] * 16}
    durations.update({f"C{k + 1}": [0.2 * float(np.exp(-x))] * 16 for k, x in enumerate(d)})
    return RunSpec(repeats=len(d), durations=durations)


def test_one_triplet_is_bounded_by_a_calibration_and_the_run_is_pooled_with_it(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    record_calibration(tmp_path, "cal1", pid, RECORDED_HOST, sd=0.05, df=4)
    make_run(tmp_path, "run1")
    iv = audit_run(tmp_path, "run1").document["interval"]
    assert (iv["variance_source"], iv["sd"], iv["df"], iv["calibration_used"]) == (
        "calibration", 0.05, 4, {"run_id": "cal1", "sd": 0.05, "df": 4})
    assert "from A/A calibration run cal1 alone (one triplet has no spread of its own)" in iv["words"]
    # two triplets d = 0.6 and 0.7 (run SD 0.0707, df 1) pooled with SD 0.05 (df 4): sqrt((0.005 + 0.01) / 5)
    pid2 = synthetic_protocol_id(2)
    record_calibration(tmp_path, "cal2", pid2, RECORDED_HOST, sd=0.05, df=4)
    make_run(tmp_path, "run2", _run_with([0.6, 0.7]))
    doc = audit_run(tmp_path, "run2").document
    iv = doc["interval"]
    sd = (0.015 / 5) ** 0.5
    # issue 52: the calibration's A/A mean (0 here) is subtracted and its variance 0.05^2 / 5 launches carried
    half = 2.5705818366147395 * (sd**2 / 2 + 0.05**2 / 5) ** 0.5
    assert (iv["variance_source"], iv["df"]) == ("pooled", 5) and iv["sd"] == pytest.approx(sd)
    assert iv["low"] == pytest.approx(np.exp(0.65 - half)) and iv["high"] == pytest.approx(np.exp(0.65 + half))
    assert iv["log_speedups"] == pytest.approx([0.6, 0.7]) and iv["spread_check"]["larger"] is False
    assert iv["spread_check"]["words"].endswith("; the run is pooled with the calibration")
    assert doc["verdict"] == "accepted" and doc["direction"] == "faster"


def test_a_run_whose_spread_is_larger_than_calibrated_falls_back_to_its_own_and_says_so(tmp_path: Path) -> None:
    record_calibration(tmp_path, "cal1", synthetic_protocol_id(3), RECORDED_HOST, sd=0.01, df=4)
    make_run(tmp_path, "run1", _run_with([0.3, 0.6, 0.9]))  # run SD 0.3, F = 900
    doc = audit_run(tmp_path, "run1").document
    iv = doc["interval"]
    assert (iv["variance_source"], iv["df"], iv["calibration_used"]) == ("run", 2, None)
    assert iv["sd"] == pytest.approx(0.3) and iv["spread_check"]["larger"] is True
    assert iv["spread_check"]["words"].endswith("; the interval falls back to the run's own spread")
    assert "from the run's own triplets (their spread is larger than the calibration's, which is not used)" in (
        iv["words"])
    md = (tmp_path / "runs" / "run1" / "audit.md").read_text()
    assert "\n- spread check: the run's triplet SD 0.3000 (df 2) is larger than the calibration's 0.0100 (df 4)" in md


def test_an_outlier_triplet_is_named_and_does_not_decide(tmp_path: Path) -> None:
    # d = 0.69, 0.70, 0.71 and 1.2: the fourth stands apart (leave-one-out z 17.2); without it the run is still faster
    record_calibration(tmp_path, "cal1", synthetic_protocol_id(4), RECORDED_HOST, sd=0.03, df=4)
    make_run(tmp_path, "run1", _run_with([0.69, 0.70, 0.71, 1.2]))
    doc = audit_run(tmp_path, "run1").document
    out = doc["interval"]["outliers"]["triplets"]
    assert [o["triplet"] for o in out] == [4] and out[0]["z"] == pytest.approx(17.2, abs=0.1)
    assert out[0]["without"][0] > 1.0  # the decision without it is the same: a diagnostic only
    assert doc["verdict"] == "accepted" and doc["direction"] == "faster"
    assert any(n.startswith("outlier triplet 4: its paired log speedup stands apart from the others (z = 17.")
               for n in doc["diagnostics"])


def test_a_calibration_recorded_before_paired_statistics_is_shown_not_pooled(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    old = CalibrationV1(
        run_id="cal-old", of_protocol_id=pid, of_protocol_name="synthetic", aa_protocol_id="0" * 64,
        host=RECORDED_HOST, repeats=2, headlines=[0.97, 1.02], estimate=1.01, low=0.9, high=1.12, level=0.95,
        launch_sd=0.04, launch_level_sd=0.035, window_level_sd=0.02, triplets_for_5pct=4,
        recorded_at="2025-01-01T00:00:00Z")
    h = resolve_home(tmp_path)
    (h.run_dir("cal-old")).mkdir(parents=True)
    data = (old.model_dump_json(by_alias=True, indent=1) + "\n").encode()
    (h.run_dir("cal-old") / CALIBRATION_FILE).write_bytes(data)
    Ledger(h.ledger_path).append(run_id="cal-old", package="calibration", kind="calibration", status="ok", gpus=0,
                                 host=RECORDED_HOST["host_hash"], protocol_id=pid,
                                 result_digest=hashlib.sha256(data).hexdigest(), note="A/A calibration")
    make_run(tmp_path, "run1")
    doc = audit_run(tmp_path, "run1").document
    block = doc["calibration"]
    assert (block["found"], block["usable"], block["schema"], block["run_id"]) == (
        True, False, "orch.calibration/1", "cal-old")
    assert block["words"].endswith("recorded before paired statistics (orch.calibration/1): shown, not pooled; "
                                   "re-run `orch calibrate PROTOCOL` on this host")
    assert doc["interval"]["bounded"] is False and doc["verdict"] == "no difference shown"
    assert doc["reasons"][0].startswith("the speedup cannot be bounded yet")
    # find_calibration reads either schema from the same ledger
    records = Ledger(h.ledger_path).records()
    assert find_calibration(h.runs, records, pid, HOST_FINGERPRINT, None)["usable"] is False


def test_a_candidate_and_its_null_share_a_baseline_workload_and_other_baselines_do_not() -> None:
    """baseline_workload_id leaves out the name, candidate arm, scorer, timeouts and repeats, nothing else."""
    cuda1, null = (load_protocol(REPO / "protocol" / f"{n}.yaml") for n in ("r3_mini_cuda1", "r3_mini_cuda1_null"))
    assert cuda1.id != null.id
    assert baseline_workload_id(cuda1.protocol) == baseline_workload_id(null.protocol)
    cpu = load_protocol(REPO / "protocol" / "r3_mini.yaml").protocol
    assert baseline_workload_id(cpu) != baseline_workload_id(cuda1.protocol)  # another device and launcher
    more_steps = cpu.model_copy(update={"measurement": cpu.measurement.model_copy(update={"steps": 18})})
    assert baseline_workload_id(more_steps) != baseline_workload_id(cpu)
    other_switch = cpu.model_copy(update={"arms": cpu.arms.model_copy(update={
        "baseline": cpu.arms.baseline.model_copy(update={"switches": {"R3_FUSE_CUDA_GRAPH": "1"}})})})
    assert baseline_workload_id(other_switch) != baseline_workload_id(cpu)
    repeated = cpu.model_copy(update={"name": "x", "measurement": cpu.measurement.model_copy(update={"repeats": 3})})
    assert baseline_workload_id(repeated) == baseline_workload_id(cpu)


def test_a_calibration_of_another_protocol_with_this_baseline_workload_is_used_and_named(tmp_path: Path) -> None:
    pid = _synthetic_protocol_id(tmp_path)
    run_protocol = Protocol.model_validate_json((tmp_path / "probe" / "runs" / "run1" / "protocol.json").read_bytes())
    workload = baseline_workload_id(run_protocol)
    # another workload's calibration (another protocol id, another baseline) is passed over ...
    record_calibration(tmp_path, "cal-other", "e" * 64, RECORDED_HOST, sd=0.01, workload_id="f" * 64)
    make_run(tmp_path, "run1")
    assert audit_run(tmp_path, "run1").document["calibration"]["found"] is False
    # ... one of another protocol id whose baseline workload is this run's is used, and the audit says whose it is
    record_calibration(tmp_path, "cal-null", "d" * 64, RECORDED_HOST, sd=0.05, workload_id=workload)
    make_run(tmp_path, "run2")
    doc = audit_run(tmp_path, "run2").document
    block, iv = doc["calibration"], doc["interval"]
    assert (block["found"], block["usable"], block["run_id"], block["of_protocol_id"]) == (
        True, True, "cal-null", "d" * 64)
    assert (f"; calibrated on protocol synthetic ({'d' * 12}), whose baseline workload is this run's; age "
            in block["words"])
    assert iv["calibration_used"] == {"run_id": "cal-null", "sd": 0.05, "df": 4}
    assert pid != "d" * 64
