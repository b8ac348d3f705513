"""`orch calibrate`: the A/A protocol, the calibration record, and which audits may show it (same host, same id).

One real A/A run with repeats 2 on r3-mini (2 CPU ranks); the matching rules on fabricated runs and ledgers.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from test_audit import HOST_FINGERPRINT, make_run

from ledger.cost.store import Ledger
from ledger.verdict.audit import audit_run
from ledger.verdict.calibration import CALIBRATION_FILE, Calibration
from orchestrator.calibrate import aa_protocol
from protocol.home import resolve_home
from protocol.schema import load_protocol

RECORDED_HOST = {k: str(v) for k, v in HOST_FINGERPRINT.items()}  # a calibration records the fingerprint as text

REPO = Path(__file__).resolve().parents[2]


def test_aa_protocol_puts_the_baseline_in_both_arms() -> None:
    loaded = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    aa = aa_protocol(loaded, 3)
    assert aa.protocol.arms.candidate == aa.protocol.arms.baseline == loaded.protocol.arms.baseline
    assert aa.protocol.measurement.repeats == 3 and aa.protocol.name == "r3-mini-cpu2-aa"
    assert aa.id != loaded.id and aa.protocol.recipe == loaded.protocol.recipe
    assert aa_protocol(loaded, None).protocol.measurement.repeats == loaded.protocol.measurement.repeats


def _record_calibration(home: Path, run_id: str, protocol_id: str, host: dict[str, str], **over: object) -> Path:
    cal = Calibration(
        run_id=run_id, of_protocol_id=protocol_id, of_protocol_name="synthetic", aa_protocol_id="0" * 64,
        host=host, repeats=2, headlines=[0.97, 1.02], estimate=1.01, low=0.9, high=1.12, level=0.95,
        launch_sd=0.04, launch_level_sd=0.035, window_level_sd=0.02, triplets_for_5pct=4,
        recorded_at="2025-01-01T00:00:00Z",
    )
    cal = cal.model_copy(update=over)
    run_dir = resolve_home(home).run_dir(run_id)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = (cal.model_dump_json(by_alias=True, indent=1) + "\n").encode()
    (run_dir / CALIBRATION_FILE).write_bytes(data)
    resolve_home(home).ledger_dir.mkdir(parents=True, exist_ok=True)
    Ledger(resolve_home(home).ledger_path).append(
        run_id=run_id, package="calibration", kind="calibration", status="ok", gpus=0, host=host["host_hash"],
        protocol_id=protocol_id, result_digest=hashlib.sha256(data).hexdigest(), note="A/A calibration",
    )
    return run_dir


def _synthetic_protocol_id(tmp_path: Path) -> str:
    probe = make_run(tmp_path / "probe")  # the fabricated runs share one protocol
    return str(json.loads((probe / "run.json").read_text())["protocol_id"])


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
        assert block["run_id"] == "cal1" and block["headlines"] == [0.97, 1.02] and block["covers_one"]
        assert block["words"].startswith("A/A run cal1 on this host (2 triplet(s)): null headlines 0.9700 / 1.0200")
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
    (cal_dir / CALIBRATION_FILE).write_text((cal_dir / CALIBRATION_FILE).read_text().replace("0.97", "0.99"))
    block = audit_run(tmp_path, "run2").document["calibration"]
    assert block["found"] is True and block["run_id"] == "cal-late"  # the altered, later one is passed over
    late = tmp_path / "runs" / "cal-late" / CALIBRATION_FILE
    late.write_text(late.read_text().replace("1.12", "1.13"))
    make_run(tmp_path, "run3")
    block = audit_run(tmp_path, "run3").document["calibration"]
    assert block["found"] is False and "run cal2: calibration.json does not hash to its ledger record" in block["words"]
    assert "run cal-late: calibration.json does not hash to its ledger record" in block["words"]
