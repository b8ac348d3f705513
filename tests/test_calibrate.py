"""`orch calibrate`: the A/A protocol, the calibration record, and which audits may show it (same host, same id).

One real A/A run with repeats 2 on r3-mini (2 CPU ranks); the matching rules on fabricated runs and ledgers.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml
from test_audit import HOST, make_run

from ledger.cost.store import Ledger
from ledger.verdict.audit import audit_run
from ledger.verdict.calibration import CALIBRATION_FILE, Calibration
from orchestrator.calibrate import aa_protocol
from protocol.home import resolve_home
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[1]


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
    host = {"host_hash": HOST, "torch": "2.13.0"}  # make_run's host fingerprint
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
    _record_calibration(tmp_path, "cal-late", pid, {"host_hash": HOST, "torch": "2.13.0"})
    assert audit_run(tmp_path, "run1").document["calibration"]["found"] is False
    cal_dir = _record_calibration(tmp_path, "cal2", pid, {"host_hash": HOST, "torch": "2.13.0"})
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


@pytest.mark.slow
def test_calibrate_on_cpu_records_an_aa_run_of_two_triplets(tmp_path: Path) -> None:
    """A real A/A run with repeats 2: per-triplet headlines, an interval, a verdict word, a ledger record."""
    from test_audit_e2e import small_protocol
    from test_launch import env, make_project, orch, records

    proj = make_project(tmp_path)
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    small_protocol(data)
    protocol = proj / "protocol" / "small.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    proc = subprocess.run(
        orch("calibrate", str(protocol), "--repeats", "2", "--home", str(home), "--json", "--lock-dir",
             str(tmp_path / "locks"), cwd=proj), cwd=proj, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    run_id = out["run_id"]
    assert out["status"] == "complete" and out["verdict"] in ("accepted", "no difference shown")
    assert set(out["packages"].values()) == {"ok"}
    run_dir = home / "runs" / run_id
    run = json.loads((run_dir / "run.json").read_text())
    assert [p["name"] for p in run["packages"]] == [
        "checks", "train-A1", "reload-A1", "train-C1", "reload-C1", "train-B1", "reload-B1",
        "train-B2", "reload-B2", "train-C2", "reload-C2", "train-A2", "reload-A2", "watch-C", "score"]
    audit = json.loads((run_dir / "audit.json").read_text())
    assert audit["measurement"]["repeats"] == 2 and audit["exact"] is True
    assert [t["order"] for t in audit["replication"]["triplets"]] == [["A1", "C1", "B1"], ["B2", "C2", "A2"]]
    assert len(audit["replication"]["headlines"]) == 2 and audit["interval"]["df"] == 4
    assert audit["calibration_of"]["protocol_id"] == load_protocol(protocol).id
    cal = Calibration.model_validate_json((run_dir / CALIBRATION_FILE).read_bytes())
    assert cal.of_protocol_id == load_protocol(protocol).id and cal.host["host_hash"] == audit["host_hash"]
    assert cal.headlines == audit["replication"]["headlines"] and cal.low == audit["interval"]["low"]
    recs = [r for r in records(home) if r["run_id"] == run_id]
    cal_recs = [r for r in recs if r["kind"] == "calibration"]
    assert len(cal_recs) == 1 and cal_recs[0]["protocol_id"] == cal.of_protocol_id
    assert cal_recs[0]["result_digest"] == hashlib.sha256((run_dir / CALIBRATION_FILE).read_bytes()).hexdigest()
    # every launch is accounted: 15 packages open and close, GPU-seconds (0 on CPU) and wall time recorded
    kinds = ("checks", "train", "reload", "replay", "score")
    closes = [r for r in recs if r["kind"] in kinds and r["status"] != "open"]
    assert len(closes) == 15 and all(r["wall_s"] > 0 for r in closes)
    assert "calibration recorded for protocol" in proc.stderr + proc.stdout
    # the A/A run's own audit re-reads equal (the calibration record does not change its evidence)
    again = subprocess.run(orch("audit", run_id, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["written"] is False
