"""A new user's path with a plain Hugging Face Trainer script (issue 53): orch from its installed wheel (wheelutil:
a fresh virtual environment, the user's shell environment, no path into this tree) and
tests/fixtures/hf_trainer/train.py, no orch import and no callback, in a git project whose path is as long as a real
one, through `orch init`, `orch freeze`, `orch calibrate` and `orch launch` with a DataLoader worker and the default
home ./.orch, to a complete, exact audit that compared the Trainer's own logged numbers and bounded its one triplet
with the calibration. Two files are written by hand: the scorer's metric, and one line of the drafted protocol
(the DataLoader worker, which the script's defaults leave off)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from launchutil import GIT, REPO
from wheelutil import installed_tool, run, user_env

pytestmark = pytest.mark.slow
SCORER = ("import argparse, json\nap = argparse.ArgumentParser()\nap.add_argument('--ckpt')\nap.add_argument('--out')\n"
          "a = ap.parse_args()\njson.dump({'dev': 1.0}, open(a.out, 'w'))\n")


def test_a_plain_trainer_script_reaches_a_calibrated_exact_audit_from_the_wheel(tmp_path: Path) -> None:
    tool = installed_tool(tmp_path / "wheel")
    env = user_env()
    orch = str(tool / "orch")
    where = run([str(tool / "python"), "-c", "import orchestrator; print(orchestrator.__file__)"], tmp_path, env)
    assert where.startswith(str(tool.parent)) and not where.startswith(str(REPO))  # the wheel's orch, not this tree's
    proj = tmp_path / "home-of-a-user" / "projects" / "transformer-speedup-investigation" / "trainer-project"
    (proj / "src").mkdir(parents=True)
    assert len(str(proj)) > 90  # the private TMPDIR under ./.orch would be about 190 characters
    shutil.copy(REPO / "tests" / "fixtures" / "hf_trainer" / "train.py", proj / "src" / "train.py")
    (proj / "src" / "score.py").write_text(SCORER)  # the one file of the user's own: the DEV scorer
    run(["git", "init", "-q"], proj, env)
    run([orch, "init", "src/train.py", "--device", "cpu"], proj, env)  # 1
    protocol = proj / "protocol" / "train_cpu2.yaml"
    data = yaml.safe_load(protocol.read_text())
    data["launcher"]["args"] += ["--dataloader_num_workers", "1"]  # a DataLoader worker: an AF_UNIX socket in TMPDIR
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    run([orch, "freeze", "--protocol", "protocol/train_cpu2.yaml", "-o", "manifests/train.json"], proj, env)  # 2
    run([*GIT, "add", "-A"], proj, env)  # 3
    run([*GIT, "commit", "-q", "-m", "trainer, drafts, commitment"], proj, env)  # 4
    locks = ["--lock-dir", str(tmp_path / "locks")]
    cal = json.loads(run([orch, "calibrate", "protocol/train_cpu2.yaml", "--repeats", "2", "--json", *locks], proj,
                         env, timeout=900))  # 5
    assert len(cal["calibration"]["run_ids"]) == 2, cal
    out = run([orch, "launch", "protocol/train_cpu2.yaml", "--json", *locks], proj, env, timeout=900)  # 6
    summary = json.loads(out)
    assert summary["status"] == "complete", summary
    shown = run([orch, "audit", summary["run_id"], "--json"], proj, env)  # 7
    audit = json.loads(shown.strip().splitlines()[-1])["audit"]
    assert audit["exact"] is True, audit["reasons"]
    assert not any("logged no training step" in r for r in audit["reasons"])
    iv = audit["interval"]
    assert iv["variance_source"] == "calibration" and iv["high"] is not None, iv  # one triplet, bounded
    assert (iv.get("calibration_used") or {}).get("run_id") == cal["calibration"]["run_id"], iv
    steps = [json.loads(line) for line in (proj / ".orch" / "runs" / summary["run_id"] / "packages" / "train-A" /
                                           "steps.rank0.jsonl").read_text().splitlines()]
    assert {"log.trainer[0].loss", "log.trainer[0].grad_norm"} <= set(steps[1]["scalars"])  # the Trainer's own log
    assert run(["git", "status", "--porcelain"], proj, env) == ""  # the home is in the project, never listed by git
