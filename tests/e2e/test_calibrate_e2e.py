"""`orch calibrate` end to end: two real A/A launches of one triplet each on the minimal trainer (1 CPU rank: nothing
here is about r3-mini or ranks; launchutil.make_minimal_project, one_rank), recorded in the ledger, then the owner's one
triplet of the same protocol, bounded by them."""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import subprocess
from pathlib import Path
from typing import Any

from launchutil import MINIMAL_PROTOCOL, edit_protocol, env, launch_cmd, make_minimal_project, one_rank, orch, records

from ledger.verdict.decide.calibration import CALIBRATION_FILE, Calibration
from ledger.verdict.decide.stats import triplets_needed
from protocol.results import ChecksResult
from protocol.schema import load_protocol


def test_calibrate_on_cpu_records_two_aa_launches_that_bound_one_triplet(tmp_path: Path) -> None:
    """Two real A/A launches of one triplet each: their paired log speedups, SD between launches (df 1), a ledger
    record; then a launch of the protocol's one triplet, whose interval is bounded by that calibration alone."""
    proj = make_minimal_project(tmp_path)

    def one_rank_diagnosed(data: dict[str, Any]) -> None:  # one rank, and a GPU diagnostic of the protocol's own
        one_rank(data)
        data.setdefault("checks", {})["diagnostics"] = [
            {"name": "diag", "command": ["python", "-c", "print('diagnosed')"]}]

    protocol = edit_protocol(proj, one_rank_diagnosed, name="one.yaml", source=MINIMAL_PROTOCOL)
    home = tmp_path / "home"
    proc = subprocess.run(
        orch("calibrate", str(protocol), "--repeats", "2", "--home", str(home), "--json", "--lock-dir",
             str(tmp_path / "locks"), cwd=proj), cwd=proj, env=env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    run_id = out["run_id"]  # the last A/A launch: its folder holds calibration.json
    assert out["status"] == "complete" and set(out["packages"].values()) == {"ok"}
    cal = Calibration.model_validate_json((home / "runs" / run_id / CALIBRATION_FILE).read_bytes())
    assert cal.run_ids is not None and len(cal.run_ids) == 2 and cal.run_ids[-1] == run_id
    assert cal.run_ids[0] != run_id and out["calibration"]["run_ids"] == cal.run_ids
    d, heads = [], []
    for aa_id in cal.run_ids:
        run_dir = home / "runs" / aa_id
        run = json.loads((run_dir / "run.json").read_text())
        # the owner's plan up to the last timed launch (issue 51: the reload after it is read by nothing); no
        # watched replay of a candidate that is the baseline, no scorer; the last launch keeps no checkpoint
        assert [p["name"] for p in run["packages"]] == [
            "checks", "train-A", "reload-A", "train-C", "reload-C", "train-B"]
        audit = json.loads((run_dir / "audit.json").read_text())
        assert audit["replication"]["repeats"] == 1 and audit["exact"] is True
        assert audit["exactness"]["replay_equal"] is None and not (run_dir / "score.sealed.json").exists()
        assert audit["calibration_of"]["protocol_id"] == load_protocol(protocol).id
        assert cal.host["host_hash"] == audit["host_hash"]
        d.extend(audit["interval"]["log_speedups"])
        heads.extend(audit["replication"]["headlines"])
    # the first A/A launch ran the diagnostic; the second left it to the first under the same versions (the owner's
    # rule: rerun the GPU diagnostics after upgrades), named in its run record and its checks result
    first, second = (ChecksResult.model_validate_json((home / "runs" / i / "packages" / "checks" / "result.json")
                                                      .read_bytes()) for i in cal.run_ids)
    assert [d.name for d in first.diagnostics] == ["diag"] and first.diagnosed_by is None
    assert second.diagnostics == [] and second.diagnosed_by == cal.run_ids[0] and second.versions == first.versions
    of = [json.loads((home / "runs" / i / "run.json").read_text())["calibration_of"] for i in cal.run_ids]
    assert of[0].get("diagnosed_by") is None and of[1]["diagnosed_by"] == cal.run_ids[0]
    said = ("checks: ok in", f"(the diagnostics not run again: run {cal.run_ids[0]} (this calibration's first A/A "
            "launch) passed them under the same versions)")
    assert any(all(x in line for x in said) for line in proc.stderr.splitlines()), proc.stderr[-3000:]
    assert [r["note"] for r in records(home) if r["run_id"] == cal.run_ids[1] and r["package"] == "checks"
            and r["status"] == "ok"] == [said[1][1:-1]]
    assert cal.of_protocol_id == load_protocol(protocol).id and (cal.df, cal.repeats) == (1, 2)
    assert cal.log_speedups == d and cal.headlines == heads
    assert math.isclose(cal.sd, statistics.stdev(cal.log_speedups), rel_tol=1e-12)
    assert math.isclose(cal.mean_log_speedup, statistics.fmean(cal.log_speedups), rel_tol=1e-9, abs_tol=1e-15)
    # the K it names for +-5% counts the error of the A/A mean that a later run subtracts (issue 50)
    assert cal.triplets_for_5pct == triplets_needed(cal.sd, cal.df, carried=cal.sd**2 / cal.repeats)
    recs = [r for r in records(home) if r["run_id"] in cal.run_ids]
    cal_recs = [r for r in recs if r["kind"] == "calibration"]
    assert len(cal_recs) == 1 and cal_recs[0]["protocol_id"] == cal.of_protocol_id and cal_recs[0]["run_id"] == run_id
    assert cal_recs[0]["result_digest"] == hashlib.sha256(
        (home / "runs" / run_id / CALIBRATION_FILE).read_bytes()).hexdigest()
    # every launch is accounted: 2 x 6 packages open and close, GPU-seconds (0 on CPU) and wall time recorded
    kinds = ("checks", "train", "reload", "replay", "score")
    closes = [r for r in recs if r["kind"] in kinds and r["status"] != "open"]
    assert len(closes) == 12 and all(r["wall_s"] > 0 for r in closes)
    assert "calibration recorded for protocol" in proc.stderr + proc.stdout
    assert "A/A launch 2 of 2" in proc.stderr + proc.stdout
    # the last A/A launch's own audit re-reads equal (the calibration record does not change its evidence)
    again = subprocess.run(orch("audit", run_id, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout.strip().splitlines()[-1])["written"] is False

    # the owner's one triplet of the same protocol: bounded by the calibration's spread alone (df 1)
    one = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                         timeout=900)
    assert one.returncode == 0, one.stderr[-3000:]
    run2 = json.loads(one.stdout.strip().splitlines()[-1])["run_id"]
    # before the lock, the launch said what this calibration lets it decide (issue 50); the A/A launches did not
    assert "forecast: this host's calibration (SD " in one.stderr + one.stdout
    assert "forecast:" not in proc.stderr + proc.stdout
    doc = json.loads((home / "runs" / run2 / "audit.json").read_text())
    assert doc["calibration"]["found"] and doc["calibration"]["usable"] and doc["calibration"]["run_id"] == run_id
    iv2 = doc["interval"]
    assert iv2["bounded"] and (iv2["triplets"], iv2["variance_source"]) == (1, "calibration")
    # the calibration records the baseline's step SD, so it is scaled by the candidate's within-launch noise R
    # (issue 34, ledger/verdict/decide/noise.py): SD times sqrt(max(R, r0)) (issue 52: a steadier candidate never
    # narrows it below the calibration's own interval), with the equivalent df of that statistic
    noise = iv2["noise"]
    assert cal.step_sd is not None and iv2["df"] == noise["equivalent_df"] and 0 < iv2["df"]
    # ... and its step profile (issue 50): the candidate's contrasts are taken about a line in it, one df fewer
    assert cal.profile_steps is not None and cal.step_profile is not None
    assert len(cal.step_profile) == len(cal.profile_steps) >= 3
    assert noise["profile_fitted"] is True and noise["df"][0] == len(cal.profile_steps) - 2
    assert iv2["calibration_used"]["run_id"] == run_id
    assert noise["applied"] >= noise["ratio"] and noise["applied"] > 0
    assert math.isclose(iv2["sd"], cal.sd * math.sqrt(noise["applied"]), rel_tol=1e-9), (iv2["sd"], cal.sd, noise)
    assert 0.0 < iv2["low"] < iv2["estimate"] < iv2["high"] < math.inf
    excludes = iv2["low"] > 1.0 or iv2["high"] < 1.0
    busy = (doc.get("host_watch") or {}).get("busy") or []  # a parallel test's load on the ranks' cores
    # what never decides alone (issue 34): an outlier triplet, an outlier window, a triplet whose A and B disagree
    # beyond the calibrated between-launch spread; each may or may not decide here (d is near 0 on a null)
    assert "A/B launch check:" in iv2["words"] and iv2["baseline_check"]["factor"] == 4 / 3
    ab_flagged = bool(iv2["baseline_check"]["triplets"])  # at K = 1 nothing is left without the triplet
    same_way = [w["without"] for w in (iv2.get("window_check") or {}).get("windows", [])]
    holds = all((lo > 1.0) == (iv2["low"] > 1.0) and (hi < 1.0) == (iv2["high"] < 1.0) for _, lo, hi in same_way)
    decides = excludes and not busy and not iv2["outliers"]["triplets"] and not ab_flagged and holds
    assert doc["verdict"] == ("accepted" if decides else "no difference shown"), (doc["verdict"], iv2["words"])
    assert f"SD of A/A run {run_id}" in records(home)[-1]["note"]
