"""orch as a user installs and runs it (issues 33, 53), from its wheel (wheelutil: a fresh virtual environment, the
user's shell environment, no path into this tree): one new user's path, read by the three tests below.

The path: tests/fixtures/hf_trainer/train.py, a plain Hugging Face Trainer script (no orch import, no callback), in
a git project whose path is as long as a real one, through `orch init`, `orch freeze`, `orch calibrate` (two A/A
launches) and `orch launch` with a DataLoader worker and the default home ./.orch, to a complete, exact audit. Two
files are written by hand: the scorer's metric, and the drafted protocol, in which the DataLoader worker (which the
script's defaults leave off) is one line; the test also gives the protocol a diagnostic command of its own, which the
calibration's first A/A launch runs and its second leaves to the first (what `orch calibrate` is tested for here, not
something a new user needs).

Read by: the user's path (an exact audit of the Trainer's own logged numbers, its one triplet bounded by the
calibration); the installed tool (orch and gpu-run from the wheel, the command orch rendered); and `orch calibrate`
end to end (its ledger records, its diagnostics, the interval it gives the owner's one triplet)."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchutil import GIT, REPO, records
from wheelutil import installed_tool, run, user_env

from ledger.verdict.decide.calibration import CALIBRATION_FILE, Calibration
from ledger.verdict.decide.stats import triplets_needed
from protocol.recipe import load_recipe, recipe_flags
from protocol.results import ChecksResult
from protocol.schema import load_protocol

pytestmark = pytest.mark.slow
SCORER = ("import argparse, json\nap = argparse.ArgumentParser()\nap.add_argument('--ckpt')\nap.add_argument('--out')\n"
          "a = ap.parse_args()\njson.dump({'dev': 1.0}, open(a.out, 'w'))\n")
PROTOCOL = Path("protocol") / "train_cpu2.yaml"


@dataclass(frozen=True)
class UserPath:
    tool: Path  # bin/ of the fresh virtual environment
    env: dict[str, str]
    proj: Path
    home: Path  # the default home, ./.orch
    cal: dict[str, Any]  # `orch calibrate --json`
    cal_said: str  # its stderr and stdout
    launch: dict[str, Any]  # `orch launch --json`
    launch_said: str
    audit: dict[str, Any]  # `orch audit --json`'s audit


def _orch(tool: Path, proj: Path, env: dict[str, str], *args: str) -> tuple[dict[str, Any], str]:
    """One orch command of the installed tool in the project: (its last JSON line, its stderr and stdout)."""
    done = subprocess.run([str(tool / "orch"), *args], cwd=proj, env=env, capture_output=True, text=True, timeout=900,
                          check=False)
    assert done.returncode == 0, f"orch {args[0]} exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr + done.stdout


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> UserPath:
    tmp = tmp_path_factory.mktemp("user")
    tool = installed_tool(tmp / "wheel")
    env = user_env()
    orch = str(tool / "orch")
    proj = tmp / "home-of-a-user" / "projects" / "transformer-speedup-investigation" / "trainer-project"
    (proj / "src").mkdir(parents=True)
    assert len(str(proj)) > 90  # the private TMPDIR under ./.orch would be about 190 characters
    shutil.copy(REPO / "tests" / "fixtures" / "hf_trainer" / "train.py", proj / "src" / "train.py")
    (proj / "src" / "score.py").write_text(SCORER)  # the one file of the user's own: the DEV scorer
    run(["git", "init", "-q"], proj, env)
    run([orch, "init", "src/train.py", "--device", "cpu"], proj, env)  # 1
    data = yaml.safe_load((proj / PROTOCOL).read_text())
    data["launcher"]["args"] += ["--dataloader_num_workers", "1"]  # a DataLoader worker: an AF_UNIX socket in TMPDIR
    data.setdefault("checks", {})["diagnostics"] = [  # the test's own: run by the first A/A launch only
        {"name": "diag", "command": ["python", "-c", "print('diagnosed')"]}]
    (proj / PROTOCOL).write_text(yaml.safe_dump(data, sort_keys=False))
    run([orch, "freeze", "--protocol", str(PROTOCOL), "-o", "manifests/train.json"], proj, env)  # 2
    run([*GIT, "add", "-A"], proj, env)  # 3
    run([*GIT, "commit", "-q", "-m", "trainer, drafts, commitment"], proj, env)  # 4
    locks = ["--lock-dir", str(tmp / "locks")]
    cal, cal_said = _orch(tool, proj, env, "calibrate", str(PROTOCOL), "--repeats", "2", "--json", *locks)  # 5
    launch, launch_said = _orch(tool, proj, env, "launch", str(PROTOCOL), "--json", *locks)  # 6
    shown, _ = _orch(tool, proj, env, "audit", launch["run_id"], "--json")  # 7
    return UserPath(tool, env, proj, proj / ".orch", cal, cal_said, launch, launch_said, shown["audit"])


def test_a_plain_trainer_script_reaches_a_calibrated_exact_audit_from_the_wheel(user: UserPath) -> None:
    assert len(user.cal["calibration"]["run_ids"]) == 2, user.cal
    assert user.launch["status"] == "complete", user.launch
    audit = user.audit
    assert audit["exact"] is True, audit["reasons"]
    assert not any("logged no training step" in r for r in audit["reasons"])
    iv = audit["interval"]
    assert iv["variance_source"] == "calibration" and iv["high"] is not None, iv  # one triplet, bounded
    assert (iv.get("calibration_used") or {}).get("run_id") == user.cal["calibration"]["run_id"], iv
    steps = [json.loads(line) for line in (user.home / "runs" / user.launch["run_id"] / "packages" / "train-A" /
                                           "steps.rank0.jsonl").read_text().splitlines()]
    assert {"log.trainer[0].loss", "log.trainer[0].grad_norm"} <= set(steps[1]["scalars"])  # the Trainer's own log
    assert run(["git", "status", "--porcelain"], user.proj, user.env) == ""  # the home is never listed by git


def test_the_wheel_gives_orch_and_gpu_run_and_the_command_orch_rendered(user: UserPath, tmp_path: Path) -> None:
    """orch and gpu-run are the wheel's, R3's recipe ships in it, and the run record and the audit show the command
    orch rendered: the script, the recipe's flags, then launcher.args."""
    assert run([str(user.tool / "orch"), "--version"], tmp_path, user.env).strip() == "orch 0.1.0"
    assert "gpu-run" in run([str(user.tool / "gpu-run"), "--help"], tmp_path, user.env)
    where = run([str(user.tool / "python"), "-c", "import orchestrator, workers.probe, protocol.recipe as r; "
                 "print(orchestrator.__file__); print(r.v1_recipe().sha256)"], tmp_path, user.env).split()
    assert where[0].startswith(str(user.tool.parent)) and not where[0].startswith(str(REPO))  # not this tree's
    assert where[1] == "27ea00d8ce839a2cf57981cca87348d24d80e5eda3849bcfee9e591df511961e"  # R3's recipe ships
    run_record = json.loads((user.home / "runs" / user.launch["run_id"] / "run.json").read_text())
    command = run_record["arms"]["candidate"]["command"]
    assert user.audit["commands"] == {"baseline": run_record["arms"]["baseline"]["command"], "candidate": command}
    data = yaml.safe_load((user.proj / PROTOCOL).read_text())  # the short form: a recipe file, no `recipe:` block
    recipe_path = data["recipe_file"]["path"]
    flags = recipe_flags(load_recipe(user.proj / recipe_path, recipe_path, None).recipe)
    script = data["launcher"]["script"]
    assert flags and command == [script, *flags, *data["launcher"]["args"]], (command, script, flags)


def test_calibrate_records_two_aa_launches_that_bound_one_triplet(user: UserPath) -> None:
    """Two real A/A launches of one triplet each: their paired log speedups, SD between launches (df 1), a ledger
    record; then the owner's launch of the protocol's one triplet, whose interval that calibration alone bounds."""
    home, out, said = user.home, user.cal, user.cal_said
    protocol_id = load_protocol(user.proj / PROTOCOL).id
    run_id = out["run_id"]  # the last A/A launch: its folder holds calibration.json
    assert out["status"] == "complete" and set(out["packages"].values()) == {"ok"}
    cal = Calibration.model_validate_json((home / "runs" / run_id / CALIBRATION_FILE).read_bytes())
    assert cal.run_ids is not None and len(cal.run_ids) == 2 and cal.run_ids[-1] == run_id
    assert cal.run_ids[0] != run_id and out["calibration"]["run_ids"] == cal.run_ids
    primed = load_protocol(user.proj / PROTOCOL).protocol.measurement.compile == "prime"
    d, heads, packages = [], [], 0
    for n, aa_id in enumerate(cal.run_ids):
        run_dir = home / "runs" / aa_id
        names = [p["name"] for p in json.loads((run_dir / "run.json").read_text())["packages"]]
        packages += len(names)
        # the owner's plan up to the last timed launch (issue 51: the reload after it is read by nothing); no
        # watched replay of a candidate that is the baseline, no scorer; the last launch keeps no checkpoint. The
        # first launch primes the compile cache (the drafted compile: prime, and nothing kept yet in a new home)
        assert [x for x in names if x != "prime"] == ["checks", "train-A", "reload-A", "train-C", "reload-C",
                                                     "train-B"], names
        assert (names[1:2] == ["prime"]) if primed and n == 0 else (names.count("prime") <= 1), names
        audit = json.loads((run_dir / "audit.json").read_text())
        assert audit["replication"]["repeats"] == 1 and audit["exact"] is True
        assert audit["exactness"]["replay_equal"] is None and not (run_dir / "score.sealed.json").exists()
        assert audit["calibration_of"]["protocol_id"] == protocol_id
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
    left = ("checks: ok in", f"(the diagnostics not run again: run {cal.run_ids[0]} (this calibration's first A/A "
            "launch) passed them under the same versions)")
    assert any(all(x in line for x in left) for line in said.splitlines()), said[-3000:]
    ledger = records(home)
    assert [r["note"] for r in ledger if r["run_id"] == cal.run_ids[1] and r["package"] == "checks"
            and r["status"] == "ok"] == [left[1][1:-1]]
    assert cal.of_protocol_id == protocol_id and (cal.df, cal.repeats) == (1, 2)
    assert cal.log_speedups == d and cal.headlines == heads
    assert math.isclose(cal.sd, statistics.stdev(cal.log_speedups), rel_tol=1e-12)
    assert math.isclose(cal.mean_log_speedup, statistics.fmean(cal.log_speedups), rel_tol=1e-9, abs_tol=1e-15)
    # the K it names for +-5% counts the error of the A/A mean that a later run subtracts (issue 50)
    assert cal.triplets_for_5pct == triplets_needed(cal.sd, cal.df, carried=cal.sd**2 / cal.repeats)
    recs = [r for r in ledger if r["run_id"] in cal.run_ids]
    cal_recs = [r for r in recs if r["kind"] == "calibration"]
    assert len(cal_recs) == 1 and cal_recs[0]["protocol_id"] == cal.of_protocol_id and cal_recs[0]["run_id"] == run_id
    assert cal_recs[0]["result_digest"] == hashlib.sha256(
        (home / "runs" / run_id / CALIBRATION_FILE).read_bytes()).hexdigest()
    # every launch is accounted: each package opens and closes, GPU-seconds (0 on CPU) and wall time recorded
    kinds = ("checks", "prime", "train", "reload", "replay", "score")
    closes = [r for r in recs if r["kind"] in kinds and r["status"] != "open"]
    assert len(closes) == packages >= 12 and all(r["wall_s"] > 0 for r in closes)
    assert "calibration recorded for protocol" in said and "A/A launch 2 of 2" in said
    # the last A/A launch's own audit re-reads equal (the calibration record does not change its evidence)
    again, _ = _orch(user.tool, user.proj, user.env, "audit", run_id, "--json")
    assert again["written"] is False

    # the owner's one triplet of the same protocol: bounded by the calibration's spread alone (df 1)
    run2 = user.launch["run_id"]
    # before the lock, the launch said what this calibration lets it decide (issue 50); the A/A launches did not
    assert "forecast: this host's calibration (SD " in user.launch_said and "forecast:" not in said
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
