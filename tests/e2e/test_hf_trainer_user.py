"""A new user's path with a plain Hugging Face Trainer script (issue 53): tests/fixtures/hf_trainer/train.py, no orch
import and no callback, in a git project whose path is as long as a real one, through `orch init`, `orch freeze` and
`orch launch` with a DataLoader worker and the default home ./.orch, to a complete, exact audit that compared the
Trainer's own logged numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from launchutil import GIT, REPO

pytestmark = pytest.mark.slow
ORCH = [sys.executable, "-m", "orchestrator.cli.orch"]
SCORER = ("import argparse, json\nap = argparse.ArgumentParser()\nap.add_argument('--ckpt')\nap.add_argument('--out')\n"
          "a = ap.parse_args()\njson.dump({'dev': 1.0}, open(a.out, 'w'))\n")


def _run(cmd: list[str], cwd: Path, timeout: int = 300) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("ORCH_HOME", "PYTHONPATH")}
    done = subprocess.run(cmd, cwd=cwd, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{cmd[3:6]} exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def test_a_plain_trainer_script_reaches_an_exact_audit_with_no_change(tmp_path: Path) -> None:
    proj = tmp_path / "home-of-a-user" / "projects" / "transformer-speedup-investigation" / "trainer-project"
    (proj / "src").mkdir(parents=True)
    assert len(str(proj)) > 90  # the private TMPDIR under ./.orch would be about 190 characters
    shutil.copy(REPO / "tests" / "fixtures" / "hf_trainer" / "train.py", proj / "src" / "train.py")
    (proj / "src" / "score.py").write_text(SCORER)  # the one file of the user's own: the DEV scorer
    _run(["git", "init", "-q"], cwd=proj)
    _run([*ORCH, "init", "src/train.py", "--device", "cpu"], cwd=proj)
    protocol = proj / "protocol" / "train_cpu2.yaml"
    data = yaml.safe_load(protocol.read_text())
    data["launcher"]["args"] += ["--dataloader_num_workers", "1"]  # a DataLoader worker: an AF_UNIX socket in TMPDIR
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    _run([*ORCH, "freeze", "--protocol", "protocol/train_cpu2.yaml", "-o", "manifests/train.json"], cwd=proj)
    _run([*GIT, "add", "-A"], cwd=proj)
    _run([*GIT, "commit", "-q", "-m", "trainer, drafts, commitment"], cwd=proj)
    out = _run([*ORCH, "launch", "protocol/train_cpu2.yaml", "--json", "--lock-dir", str(tmp_path / "locks")],
               cwd=proj, timeout=900)
    summary = json.loads(out)
    assert summary["status"] == "complete", summary
    audit = json.loads((proj / ".orch" / "runs" / summary["run_id"] / "audit.json").read_text())
    assert audit["exact"] is True, audit["reasons"]
    assert not any("logged no training step" in r for r in audit["reasons"])
    steps = [json.loads(line) for line in (proj / ".orch" / "runs" / summary["run_id"] / "packages" / "train-A" /
                                           "steps.rank0.jsonl").read_text().splitlines()]
    assert {"log.trainer[0].loss", "log.trainer[0].grad_norm"} <= set(steps[1]["scalars"])  # the Trainer's own log
    assert _run(["git", "status", "--porcelain"], cwd=proj) == ""  # the home is in the project, never listed by git
