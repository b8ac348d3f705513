"""Issue 8's acceptance on real r3-mini runs (2 CPU ranks): RNG and fp16 candidates refused, a killed run unaudited.

The real CLI runs on a git-committed project copy: baseline = `git archive HEAD`, candidate = the edited tree.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_launch import (
    env,
    launch_cmd,
    make_project,
    only_run,
    orch,
    records,
    run_processes,
    start,
    steps_done,
    wait_for,
)

pytestmark = pytest.mark.slow
TRAINER = Path("examples") / "r3_mini" / "train" / "online_rl.py"
ANCHOR = "        scheduler.step()\n"
# shorter rollouts (decode tokens, denoise steps) only: the model, its initial state and the recipe are unchanged
SMALL = ["--max_output_token_n_gen", "8", "--max_output_token_n_edit", "8",
         "--num_timesteps_gen", "4", "--num_timesteps_edit", "4"]
GIT = ["git", "-c", "user.name=orch-test", "-c", "user.email=orch-test@example.invalid", "-c", "commit.gpgsign=false"]


def small_protocol(data: dict[str, Any]) -> None:
    data["launcher"]["args"] = [*data["launcher"]["args"], *SMALL]
    data["scorer"]["command"] = [*data["scorer"]["command"], *SMALL]


def candidate_project(tmp_path: Path, extra_line: str) -> tuple[Path, Path]:
    """A committed project copy whose working tree adds `extra_line` after the trainer's scheduler.step().

    Returns the project and a protocol in which only the code differs: baseline from git HEAD under the
    published commitment, candidate = the edited tree under a commitment frozen by `orch freeze`, same switches.
    """
    proj = make_project(tmp_path)
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "baseline"], cwd=proj, check=True)
    trainer = proj / TRAINER
    text = trainer.read_text()
    assert text.count(ANCHOR) == 1
    trainer.write_text(text.replace(ANCHOR, ANCHOR + extra_line + "\n"))
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    switches = {key: "1" for key in data["arms"]["candidate"]["switches"]}
    data["arms"] = {
        "baseline": {"commitment": "manifests/r3_mini.json", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/r3_mini_cand.json", "source": "tree", "switches": dict(switches),
                      "under_evaluation": True},
    }
    small_protocol(data)
    protocol = proj / "protocol" / "candidate.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    frozen = subprocess.run(
        orch("freeze", "--protocol", str(protocol), "--arm", "candidate", "-o", "manifests/r3_mini_cand.json",
             cwd=proj), cwd=proj, env=env(), capture_output=True, text=True, timeout=60)
    assert frozen.returncode == 0, frozen.stderr
    committed = json.loads((proj / "manifests" / "r3_mini.json").read_text())["root"]
    assert json.loads((proj / "manifests" / "r3_mini_cand.json").read_text())["root"] != committed
    return proj, protocol


def launch_and_audit(tmp_path: Path, extra_line: str) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Launch the candidate protocol to completion, then `orch audit RUN --json` it; checks what both share."""
    proj, protocol = candidate_project(tmp_path, extra_line)
    home = tmp_path / "home"
    launched = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                              timeout=500)
    # the run completes: a refused candidate is an audit verdict, not a failed launch
    assert launched.returncode == 0, launched.stderr[-3000:]
    summary = json.loads(launched.stdout.strip().splitlines()[-1])
    assert summary["status"] == "complete" and summary["verdict"] == "not exact"
    assert "dev_mean_reward" not in launched.stdout + launched.stderr
    run_dir = only_run(home)
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 1, shown.stderr[-3000:]
    assert "audit verdict not exact" in shown.stderr
    # the verdict is recorded before anything reads the DEV score, which never enters it
    recs = [r for r in records(home) if r["run_id"] == run_dir.name and r["kind"] == "audit"]
    assert [(r["status"], r["note"]) for r in recs] == [("failed", "verdict: not exact")]
    for written in ("audit.json", "audit.md"):
        assert "dev_mean_reward" not in (run_dir / written).read_text()
    doc = json.loads(shown.stdout.strip().splitlines()[-1])
    assert doc["audit"]["verdict"] == "not exact" and doc["audit"]["exact"] is False
    assert doc["audit"] == json.loads((run_dir / "audit.json").read_text())
    assert "dev_mean_reward" not in json.dumps(doc["audit"]) + shown.stderr
    assert doc["dev_score"]["informational"] is True and doc["dev_score"]["verified"] is True
    assert shown.stdout.index("verdict: not exact") < shown.stdout.index("DEV score (informational")
    return run_dir, home, shown


def test_extra_rng_draw_per_step_is_refused_naming_the_first_step(tmp_path: Path) -> None:
    run_dir, _, shown = launch_and_audit(tmp_path, "        torch.rand(1)")
    ex = json.loads(shown.stdout.strip().splitlines()[-1])["audit"]["exactness"]
    # the draw after step 0's optimizer step falls in step 1 (steps are delimited by the optimizer hook)
    first = ex["rng_first_mismatch"]
    assert ex["rng_equal"] is False
    assert (first["check"], first["step"], first["rank"], first["tensor"]) == ("rng", 1, 0, "rng.cpu")
    assert first["values"]["A"] == first["values"]["B"] != first["values"]["C"]
    assert first["text"] in ex["problems"] and "rng mismatch at step 1, rank 0" in shown.stderr
    assert ex["forbidden"] == [] and ex["recipe_equal"] is True and set(ex["reload_equal"].values()) == {True}
    # the steps before the extra draw are the same bits in every arm
    step0 = {label: json.loads((run_dir / "packages" / f"train-{label}" / "steps.rank0.jsonl").read_text()
                               .splitlines()[0]) for label in "ACB"}
    assert len({s["rng"]["cpu"] for s in step0.values()}) == 1 and len({s["combined"] for s in step0.values()}) == 1


def test_fp16_candidate_is_refused_naming_the_op(tmp_path: Path) -> None:
    line = "        _ = torch.ones(4, 4, dtype=torch.float16) @ torch.ones(4, 4, dtype=torch.float16)"
    _, _, shown = launch_and_audit(tmp_path, line)
    audit = json.loads(shown.stdout.strip().splitlines()[-1])["audit"]
    forbidden = audit["exactness"]["forbidden"]
    assert forbidden and {f["arm"] for f in forbidden} == {"C"}
    assert {f["dtype"] for f in forbidden} == {"float16"}
    assert forbidden[0] == {"arm": "C", "rank": 0, "step": 1, "op": "aten.mm.default", "dtype": "float16"}
    assert {f["rank"] for f in forbidden if f["op"] == "aten.mm.default"} == {0, 1}
    assert audit["reasons"][0].startswith("forbidden dtype: aten.mm.default in float16 at step 1 (arm C, rank 0)")
    assert "forbidden dtype: aten.mm.default in float16" in shown.stderr


def test_audit_of_a_run_killed_during_train_b_writes_nothing_and_shows_no_score(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    small_protocol(data)
    protocol = proj / "protocol" / "small.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    home = tmp_path / "home"
    proc = start(proj, protocol, home)
    wait_for(lambda: (home / "runs").is_dir() and any((home / "runs").iterdir()), 60, "the run directory")
    run_dir = only_run(home)
    wait_for(lambda: steps_done(run_dir, "train-B") >= 1 or proc.poll() is not None, 400, "train-B to run")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    wait_for(lambda: not run_processes(run_dir.name), 10, "every process of the run to end")
    before = sorted((p.relative_to(run_dir).as_posix(), p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    ledger_bytes = (home / "ledger" / "ledger.arrows").read_bytes()
    for as_json in (False, True):
        shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), *(["--json"] if as_json else []),
                                    cwd=proj), cwd=proj, env=env(), capture_output=True, text=True, timeout=120)
        out = shown.stdout + shown.stderr
        assert shown.returncode == 1, out[-3000:]
        assert "missing or failed: package train-B: open ledger record without a close" in out
        assert "run status is 'running', not 'complete'" in out
        for never_reached in ("reload-B", "score"):
            assert f"package {never_reached}: no ledger record" in out
        assert "no audit was written and no score is shown" in shown.stderr
        assert "dev_mean_reward" not in out and "DEV score" not in out
        if as_json:
            doc = json.loads(shown.stdout.strip().splitlines()[-1])
            assert doc["audit"] is None and "dev_score" not in doc
            assert "package train-B: open ledger record without a close (the run crashed or is still running)" in (
                doc["problems"])
    # the audit wrote nothing: no file in the run directory, no ledger record
    assert sorted((p.relative_to(run_dir).as_posix(), p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before
    assert not (run_dir / "audit.json").exists() and not (run_dir / "score.sealed.json").exists()
    assert (home / "ledger" / "ledger.arrows").read_bytes() == ledger_bytes
