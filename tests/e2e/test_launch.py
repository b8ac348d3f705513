"""`orch launch` end to end on r3-mini (2 CPU ranks): real torchrun, real locks, real ledger, real faults.

The complete run is the suite's shared one (conftest.py); every other test launches its own, on a copy of the
project that it may edit; where it only needs a package to fail or the launch to stop, that is the minimal trainer
on one rank (launchutil.make_minimal_project, paced by MINI_STEP_S so that the test acts while the package runs). A
failing train-C that stops the run (the later packages not run, no audit, `orch audit` writing nothing) is
test_clock_e2e's launch; kill -9 of orch (no process left, the lock freed, the orphan named by `orch ledger verify`)
is test_audit_e2e's killed run: one launch each proves both.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path
from typing import Any

from launchutil import (
    EDITED,
    MINIMAL_PROTOCOL,
    PACKAGES,
    REPO,
    CompleteRun,
    edit_protocol,
    env,
    launch_cmd,
    lock_is_free,
    make_minimal_project,
    make_project,
    one_rank,
    orch,
    records,
    run_processes,
    start_until,
    wait_for,
)

from ledger.cost.store import Ledger
from ledger.verdict.decide.decision import exit_code as verdict_exit_code
from protocol.results import ReloadResult, StepRecord, TrainResult


def test_complete_run_is_sealed_against_working_tree_edits_and_audited(complete_run: CompleteRun) -> None:
    proj, home, run_dir = complete_run.proj, complete_run.home, complete_run.run_dir
    out, err = complete_run.out, complete_run.err
    # the edit of the working tree made while train-C ran (conftest.py) is there, and did not reach the run
    assert "EDITED_DURING_RUN" in (proj / EDITED).read_text()
    summary = json.loads(out)  # with --json stdout is exactly one JSON document
    # the exit code is the verdict's, the same as `orch audit` gives (0 only when accepted)
    assert complete_run.returncode == verdict_exit_code(summary["verdict"]), err[-3000:]
    assert summary["status"] == "complete" and set(summary["packages"].values()) == {"ok"}
    assert "EDITED_DURING_RUN" not in (run_dir / "sealed" / "candidate" / "train" / "train_utils.py").read_text()
    # one open and one close record for each of the 10 packages, and an audit record
    recs = [r for r in records(home) if r["run_id"] == run_dir.name]
    for name in PACKAGES:
        statuses = [r["status"] for r in recs if r["package"] == name]
        assert statuses == ["open", "ok"], (name, statuses)
    assert any(r["kind"] == "audit" for r in recs)
    ledger = Ledger(home / "ledger" / "ledger.arrows")
    assert ledger.verify().ok
    # orch's own witness of the head, outside the ledger file: after the launch's records and after the audit's
    witnessed = [json.loads(line) for line in (home / "witness" / "heads.jsonl").read_text().splitlines()]
    assert [w["by"] for w in witnessed] == [f"launch {run_dir.name}", f"audit {run_dir.name}"]
    assert witnessed[-1]["size"] == ledger.head().size and witnessed[-1]["root"] == ledger.head().root
    audit = json.loads((run_dir / "audit.json").read_text())
    assert audit["exactness"]["exact"] is True
    assert audit["attribution"]["commitment_roots"]["candidate"] == json.loads(
        (REPO / "manifests" / "r3_mini.json").read_text())["root"]
    # checkpoints never reach evidence; the DEV score is sealed, never printed
    assert not (home / "scratch" / run_dir.name).exists()
    assert "dev_mean_reward" not in out + err
    assert oct((run_dir / "score.sealed.json").stat().st_mode & 0o777) == "0o400"
    # `orch audit` shows the recorded verdict and only then the DEV score, as information
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    doc = json.loads(shown.stdout)
    assert doc["written"] is False and doc["audit"]["verdict"] == audit["verdict"]
    assert shown.returncode == complete_run.returncode
    assert doc["dev_score"]["informational"] is True and doc["dev_score"]["verified"] is True


def test_the_probe_on_r3_mini_digests_what_the_reload_reads_and_observes_the_recipe(complete_run: CompleteRun) -> None:
    """train-A and reload-A of the shared run: 16 steps on 2 ranks, digests of steps 0-13, the reload's digests equal
    to the train's final ones, the recipe and the frozen ViT observed, no forbidden op, no process left behind."""
    packages = complete_run.run_dir / "packages"
    t = TrainResult.model_validate_json((packages / "train-A" / "result.json").read_text())
    r = ReloadResult.model_validate_json((packages / "reload-A" / "result.json").read_text())
    assert t.stopped_cleanly and t.world_size == 2 and t.steps == 16 and t.digest_steps == list(range(14))
    assert [x.final_combined for x in t.ranks] == [x.combined for x in r.ranks]
    assert [x.final_digests for x in t.ranks] == [x.digests for x in r.ranks]
    rec = t.observed_recipe
    assert (rec.optimizer, rec.lr, rec.betas, rec.eps, rec.max_grad_norm) == ("AdamW", 5e-6, (0.9, 0.95), 1e-8, 1.0)
    assert rec.warmup_steps == 10 and "vit_model" in rec.frozen
    lines = (packages / "train-A" / "steps.rank0.jsonl").read_text().splitlines()
    assert len(lines) == 16 and all(StepRecord.model_validate_json(x).forbidden == [] for x in lines)
    assert run_processes(complete_run.run_dir.name) == []


def _paced(data: dict[str, Any]) -> None:
    """The minimal trainer on one rank, a quarter second (of sleep) a step: a train package lasts at least 4 s."""
    one_rank(data)
    data["launcher"]["env"]["MINI_STEP_S"] = "0.25"


def test_write_into_the_sealed_copy_fails_the_run_naming_the_path(tmp_path: Path) -> None:
    proj = make_minimal_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-A", edit_protocol(proj, _paced, source=MINIMAL_PROTOCOL))
    target = run_dir / "sealed" / "baseline" / "score.py"
    target.chmod(0o644)
    with open(target, "a") as f:
        f.write("\n# forced write\n")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "sealed copy of baseline was modified during the run: 1 changed (score.py)" in err
    recs = [r for r in records(home) if r["run_id"] == run_dir.name and r["status"] != "open"]
    assert {r["package"]: r["status"] for r in recs}["train-A"] == "failed"
    assert all(r["status"] == "not-run" for r in recs if r["package"] not in ("checks", "prime", "train-A"))
    assert not (run_dir / "audit.json").exists()


def test_ctrl_c_records_interrupted_and_exits_130(tmp_path: Path) -> None:
    proj = make_minimal_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-A", edit_protocol(proj, _paced, source=MINIMAL_PROTOCOL))
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    wait_for(lambda: not run_processes(run_dir.name), 5, "every process of the run to end")
    assert lock_is_free(home.parent / "locks")
    closes = {r["package"]: r["status"] for r in records(home) if r["run_id"] == run_dir.name and r["status"] != "open"}
    assert closes["train-A"] == "interrupted"
    assert [closes[p] for p in PACKAGES[3:]] == ["not-run"] * 7
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


def test_refused_protocol_costs_no_gpu_time(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    protocol = edit_protocol(proj, lambda d: d["recipe"].update(lr=1.0e-5))
    proc = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "recipe.lr = 1e-05 (upstream 5e-06)" in proc.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    # and sources that differ from the commitment are refused with the diff, before the lock
    (proj / "examples" / "r3_mini" / "train" / "train_utils.py").write_text("# changed\n")
    proc = subprocess.run(launch_cmd(proj, proj / "protocol" / "r3_mini.yaml", home), cwd=proj, env=env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "1 changed (train/train_utils.py)" in proc.stderr


def test_every_train_launch_is_watched_and_an_altered_watch_file_is_refused(
    complete_run: CompleteRun, tmp_path: Path
) -> None:
    """Orch sampled the host through train-A, train-C and train-B (issue 27): each host_watch.json hashes to what
    run.json recorded, the audit summarises every window; an altered file fails `orch audit`, naming it."""
    import hashlib
    import shutil

    run = json.loads((complete_run.run_dir / "run.json").read_text())
    refs = {p["name"]: p.get("host_watch") for p in run["packages"]}
    for name in ("train-A", "train-C", "train-B"):
        path = complete_run.run_dir / "packages" / name / "host_watch.json"
        assert refs[name] is not None and hashlib.sha256(path.read_bytes()).hexdigest() == refs[name]["sha256"]
        assert refs[name]["samples"] > 3, refs[name]
    assert refs["reload-A"] is None and refs["watch-C"] is None  # train launches only
    block = json.loads((complete_run.run_dir / "audit.json").read_text())["host_watch"]
    assert block["unwatched"] == [] and block["threshold"]["cpu_share"] == 0.5
    for label in ("A", "C", "B"):
        windows = block["launches"][label]["windows"]
        assert list(windows) == ["w1", "w2", "w3"] and all(w["intervals"] >= 1 for w in windows.values()), windows
    home = tmp_path / "home"
    shutil.copytree(complete_run.home, home, symlinks=True)
    altered = home / "runs" / complete_run.run_dir.name / "packages" / "train-B" / "host_watch.json"
    altered.chmod(0o644)
    altered.write_bytes(altered.read_bytes().replace(b'"steps_done":', b'"steps_done": '))
    shown = subprocess.run(orch("audit", complete_run.run_dir.name, "--home", str(home), cwd=complete_run.proj),
                           cwd=complete_run.proj, env=env(), capture_output=True, text=True, timeout=120)
    assert shown.returncode != 0 and "packages/train-B/host_watch.json: sha256 is not the one run.json recorded" in (
        shown.stdout + shown.stderr), shown.stderr[-2000:]
