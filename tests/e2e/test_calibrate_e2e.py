"""`orch calibrate` end to end: one real A/A run with repeats 2 on r3-mini (2 CPU ranks), recorded in the ledger, then
the owner's one triplet of the same protocol, bounded by it."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import subprocess
from pathlib import Path

from launchutil import edit_protocol, env, launch_cmd, make_project, orch, quick_protocol, records

from ledger.verdict.calibration import CALIBRATION_FILE, Calibration
from protocol.schema import load_protocol


def test_calibrate_on_cpu_records_an_aa_run_of_two_triplets_that_bounds_one_triplet(tmp_path: Path) -> None:
    """A real A/A run with repeats 2: per-triplet paired log speedups, their SD (df 1), a ledger record; then a
    launch of the protocol's one triplet, whose interval is bounded by that calibration alone."""
    proj = make_project(tmp_path)
    protocol = edit_protocol(proj, quick_protocol, name="quick.yaml")
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
    iv = audit["interval"]  # the A/A run's own paired interval: two triplets, df 1
    assert len(audit["replication"]["headlines"]) == 2 and iv["df"] == 1 and iv["variance_source"] == "run"
    assert audit["calibration_of"]["protocol_id"] == load_protocol(protocol).id
    cal = Calibration.model_validate_json((run_dir / CALIBRATION_FILE).read_bytes())
    assert cal.of_protocol_id == load_protocol(protocol).id and cal.host["host_hash"] == audit["host_hash"]
    assert cal.headlines == audit["replication"]["headlines"] and cal.low == iv["low"]
    assert cal.log_speedups == iv["log_speedups"] and (cal.df, cal.repeats) == (1, 2)
    assert math.isclose(cal.sd, statistics.stdev(cal.log_speedups), rel_tol=1e-12)
    assert math.isclose(cal.mean_log_speedup, statistics.fmean(cal.log_speedups), rel_tol=1e-9, abs_tol=1e-15)
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

    # the owner's one triplet of the same protocol: bounded by the calibration's spread alone (df 1)
    one = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                         timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    run2 = json.loads(one.stdout.strip().splitlines()[-1])["run_id"]
    doc = json.loads((home / "runs" / run2 / "audit.json").read_text())
    assert doc["calibration"]["found"] and doc["calibration"]["usable"] and doc["calibration"]["run_id"] == run_id
    iv2 = doc["interval"]
    assert iv2["bounded"] and (iv2["triplets"], iv2["df"], iv2["variance_source"]) == (1, 1, "calibration")
    assert iv2["calibration_used"] == {"run_id": run_id, "sd": cal.sd, "df": 1} and iv2["sd"] == cal.sd
    assert 0.0 < iv2["low"] < iv2["estimate"] < iv2["high"] < math.inf
    excludes = iv2["low"] > 1.0 or iv2["high"] < 1.0
    assert doc["verdict"] == ("accepted" if excludes else "no difference shown")
    assert f"SD of A/A run {run_id}" in records(home)[-1]["note"]
