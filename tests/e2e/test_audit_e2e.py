"""Issue 8's acceptance. On a real r3-mini run (2 CPU ranks): the cheating candidate refused, its fp16 ops among the
cheats named. On the minimal trainer (launchutil.make_minimal_project): a candidate with an extra RNG draw refused
(one rank), and a killed run unaudited (2 ranks; from the same launch, kill -9 of orch leaves no process and frees
the lock).

The real CLI runs on a git-committed project copy: baseline = `git archive HEAD`, candidate = the edited tree.
"""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from launchutil import (
    GIT,
    MINIMAL_PROTOCOL,
    edit_protocol,
    env,
    freeze,
    launch_cmd,
    lock_is_free,
    make_minimal_project,
    make_project,
    one_rank,
    only_run,
    orch,
    quick_protocol,
    records,
    run_processes,
    run_published,
    start,
    steps_done,
    wait_for,
)

from orchestrator.isolation.package_isolation import namespaces_work

TRAINER = Path("examples") / "r3_mini" / "train" / "online_rl.py"
ANCHOR = "        scheduler.step()\n"
Edit = tuple[Path, str, str]  # (file under the project, anchor line that occurs once, lines inserted after it)


MINIMAL_TRAINER = Path("trainer") / "train.py"
MINIMAL_ANCHOR = "        sched.step()\n"


def candidate_project(
    tmp_path: Path, extra_line: str | Sequence[Edit], shape: Callable[[dict[str, Any]], None] = quick_protocol,
    minimal: bool = False,
) -> tuple[Path, Path]:
    """A committed project copy whose working tree adds `extra_line` after the trainer's scheduler.step() (or
    makes each edit): r3-mini's, or with `minimal` the minimal trainer's (launchutil.make_minimal_project).

    Returns the project and a protocol in which only the code differs: baseline from git HEAD under the
    published commitment, candidate = the edited tree under a commitment frozen by `orch freeze`, same switches;
    `shape` sets the rest (quick_protocol: 12 steps, prepare-only checks; small_protocol: every check, 16 steps;
    one_rank for the minimal trainer, whose protocol is short already).
    """
    if minimal:
        proj, trainer, anchor, source, committed = (
            make_minimal_project(tmp_path), MINIMAL_TRAINER, MINIMAL_ANCHOR, MINIMAL_PROTOCOL, "minimal.json")
    else:
        proj, trainer, anchor, source, committed = (
            make_project(tmp_path), TRAINER, ANCHOR, "r3_mini.yaml", "r3_mini.json")
        subprocess.run(["git", "init", "-q", str(proj)], check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "baseline"], cwd=proj, check=True)
    edits = [(trainer, anchor, extra_line + "\n")] if isinstance(extra_line, str) else list(extra_line)
    for rel, at, lines in edits:
        path = proj / rel
        text = path.read_text()
        assert text.count(at) == 1, (rel, at)
        path.write_text(text.replace(at, at + lines))
    data = yaml.safe_load((proj / "protocol" / source).read_text())
    switches = {key: "1" for key in data["arms"]["candidate"]["switches"]}
    data["arms"] = {
        "baseline": {"commitment": f"manifests/{committed}", "source": {"git": "HEAD"}, "switches": switches},
        "candidate": {"commitment": "manifests/cand.json", "source": "tree", "switches": dict(switches),
                      "under_evaluation": True},
    }
    shape(data)
    protocol = proj / "protocol" / "candidate.yaml"
    protocol.write_text(yaml.safe_dump(data, sort_keys=False))
    freeze(proj, protocol, "manifests/cand.json", "candidate")
    root = json.loads((proj / "manifests" / committed).read_text())["root"]
    assert json.loads((proj / "manifests" / "cand.json").read_text())["root"] != root
    return proj, protocol


def launch_and_audit(
    tmp_path: Path, extra_line: str | Sequence[Edit], shape: Callable[[dict[str, Any]], None] = quick_protocol,
    minimal: bool = False,
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """Launch the candidate protocol to completion, then `orch audit RUN --json` it; checks what both share."""
    proj, protocol = candidate_project(tmp_path, extra_line, shape, minimal)
    metric = "dev_mse" if minimal else "dev_mean_reward"  # the scorer's metric: never shown before the verdict
    home = tmp_path / "home"
    launched = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                              timeout=500)
    # the run completes and its verdict decides the exit code, the same from launch and from audit
    assert launched.returncode == 1, launched.stderr[-3000:]
    summary = json.loads(launched.stdout)
    assert summary["status"] == "complete" and summary["verdict"] == "not exact"
    assert "audit verdict not exact" in launched.stderr.strip().splitlines()[-1]
    assert metric not in launched.stdout + launched.stderr
    run_dir = only_run(home)
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 1, shown.stderr[-3000:]
    assert "audit verdict not exact" in shown.stderr
    # the verdict is recorded before anything reads the DEV score, which never enters it
    recs = [r for r in records(home) if r["run_id"] == run_dir.name and r["kind"] == "audit"]
    assert [(r["status"], r["note"]) for r in recs] == [("not exact", "verdict: not exact")]
    for written in ("audit.json", "audit.md"):
        assert metric not in (run_dir / written).read_text()
    doc = json.loads(shown.stdout)
    assert doc["audit"]["verdict"] == "not exact" and doc["audit"]["exact"] is False
    assert doc["audit"] == json.loads((run_dir / "audit.json").read_text())
    assert metric not in json.dumps(doc["audit"])
    # with --json the human report is on stderr: the DEV score shows there only after the verdict is recorded
    report = shown.stderr
    assert metric not in report[: report.index("written: audit.json")]
    assert doc["dev_score"]["informational"] is True and doc["dev_score"]["verified"] is True
    assert report.index("verdict: not exact") < report.index("DEV score (informational")
    return run_dir, home, shown


def test_extra_rng_draw_per_step_is_refused_naming_the_first_step(tmp_path: Path) -> None:
    # the minimal trainer on one rank (the RNG stream is per process; nothing here is about r3-mini or how ranks
    # agree): the draw is found at step 1, and the other checks stay silent
    run_dir, _, shown = launch_and_audit(tmp_path, "        torch.rand(1)", one_rank, minimal=True)
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


UTILS = Path("examples") / "r3_mini" / "train" / "train_utils.py"
SCORER = Path("examples") / "r3_mini" / "train" / "score.py"


def test_cheating_candidate_is_refused_naming_each_cheat(tmp_path: Path) -> None:
    """One launch, independent cheats, each named: an fp16 op in a warm-up step and one first in timed step 10,
    an unfrozen ViT the optimizer excludes, a loss that differs while the gradients do not, a trainer that stops
    logging, a scorer of its own, and (where namespaces work) work cached in the shared /tmp.

    The quick protocol (12 steps: warm-up 0-1 watched in train-C, timed steps 2-11 seen only by the watched replay;
    prepare-only checks): every cheat here lives in the trainer or the scorer, none in a diagnostic."""
    cache = f"/tmp/orch-cheat-{secrets.token_hex(6)}"
    isolated = namespaces_work()
    edits: list[Edit] = [
        (TRAINER, ANCHOR, "        if curr_step == 0:  # in step 1's window, watched in every launch\n"
                          "            h = torch.ones(4, 4, dtype=torch.float16)\n"
                          "            _ = h @ h\n"
                          "        if curr_step == 9:  # first in step 10's window: a timed step\n"
                          "            _ = torch.ones(3, dtype=torch.float16) + 1\n"),
        (TRAINER, "    train_step = 0\n",
         "    model.vit_model.requires_grad_(True)  # the optimizer was built without it\n"),
        # the loss offset before backward: the same gradients (and state), another number
        (TRAINER, "                    loss = loss + kl_img_loss * training_args.kl_weight_image\n",
         "            loss = loss + 1.0\n"),
        (UTILS, "    def log(self, stream: str, record: dict) -> None:\n", "        return  # logs nothing\n"),
        (SCORER, "        json.dump(result, fh, sort_keys=True)\n",
         '    with open(score_args.out, "w", encoding="utf-8") as fh:  # scores itself\n'
         '        json.dump({"dev_mean_reward": 1.0, "cheat": True}, fh)\n'),
    ]
    if isolated:
        edits.append((TRAINER, "    logger = RunLogger(training_args.log_dir, rank)\n",
                      "    try:  # work cached for the next launch in the shared /tmp\n"
                      f"        open({cache!r}, 'w').write('cached')\n"
                      "        cheat = 'written'\n"
                      "    except OSError as exc:\n"
                      "        cheat = exc.strerror\n"
                      "    if training_args.log_dir:\n"
                      "        os.makedirs(training_args.log_dir, exist_ok=True)\n"
                      "        open(os.path.join(training_args.log_dir, f'cheat.{rank}.txt'), 'w').write(cheat)\n"))
    run_dir, home, shown = launch_and_audit(tmp_path, edits)
    doc = json.loads(shown.stdout.strip().splitlines()[-1])
    audit = doc["audit"]
    ex = audit["exactness"]
    reasons = audit["reasons"]
    # 1. what the recipe fixes: the ViT frozen, the same trainable set and counts as the baseline
    diffs = ex["recipe_differences"]
    assert ex["recipe_equal"] is False
    assert any(d.startswith("arm C: freeze_vit is frozen true but vit_model trainable") for d in diffs), diffs
    assert "arm C: trainable_params 213,568, arm A 202,368" in diffs
    assert any(d.startswith("arm C: frozen parameters differ from arm A:") and "vit_model" in d for d in diffs)
    assert not any(d.startswith("arm B") for d in diffs)
    # 2. the scorer of arm C is the baseline's sealed code: the candidate's own scorer never ran
    score_spec = json.loads((run_dir / "packages" / "score" / "package.json").read_text())
    assert {t["arm_label"]: Path(t["sealed_dir"]).name for t in score_spec["score_targets"]} == {
        "A": "baseline", "C": "baseline"}
    targets = {t["arm_label"]: t["metrics"] for t in doc["dev_score"]["metrics"]["targets"]}
    assert "cheat" not in targets["C"] and set(targets["C"]) == set(targets["A"])
    # 3. the fp16 op of a timed step is found by the watched replay and named with its step
    forbidden = ex["forbidden"]
    assert {(f["package"], f["step"], f["dtype"]) for f in forbidden} == {("train-C", 1, "float16"),
                                                                           ("watch-C", 10, "float16")}
    assert {f["op"] for f in forbidden if f["step"] == 1} == {"aten.ones.default", "aten.mm.default"}
    assert {f["op"] for f in forbidden if f["step"] == 10} == {"aten.ones.default", "aten.add.Tensor"}
    assert {f["rank"] for f in forbidden} == {0, 1} and {f["arm"] for f in forbidden} == {"C"}
    assert forbidden[0] == {"arm": "C", "rank": 0, "step": 1, "op": "aten.mm.default", "dtype": "float16",
                            "package": "train-C"}
    # the watched replay watches what train-C did not (issue 51): together every step
    assert ex["watch_coverage"]["train-C"] == list(range(2)) and ex["watch_coverage"]["watch-C"] == list(range(2, 12))
    assert ex["replay_equal"] is True  # the replay computed what train-C computed
    assert any(r.startswith("forbidden dtype: aten.mm.default in float16 at step 1 (arm C, rank 0)") for r in reasons)
    assert "audit verdict not exact: recipe violation: arm C: freeze_vit is frozen true but vit_model" in shown.stderr
    watch = [r for r in records(home) if r["run_id"] == run_dir.name and r["package"] == "watch-C"]
    assert [r["status"] for r in watch] == ["open", "ok"] and watch[1]["kind"] == "replay"
    assert audit["cost"]["wall_s"]["watch-C"] > 0
    # 6. the trainer's own numbers: the offset loss at its first backward, and the trainer that logged nothing
    first = ex["scalars_first_mismatch"]
    assert (first["check"], first["step"], first["rank"], first["tensor"]) == ("scalars", 0, 0, "backward[0]")
    assert first["values"]["A"] == first["values"]["B"] != first["values"]["C"]
    assert ("arm C: its trainer logged no training step (no number through wandb.log or logging in steps 0-11); "
            "its own numbers cannot be compared") in reasons
    assert not any("arm A: its trainer logged" in r or "arm B: its trainer logged" in r for r in reasons)
    # 4. the cache write was impossible: it failed inside the package, nothing reached the host's /tmp
    if isolated:
        for package in ("train-C", "watch-C"):
            assert (run_dir / "packages" / package / "trainer" / "cheat.0.txt").read_text() == "Read-only file system"
        assert not Path(cache).exists()
        entries = json.loads((run_dir / "run.json").read_text())["packages"]
        assert {p["isolation"] for p in entries} == {"namespace"}


def _paced(data: dict[str, Any]) -> None:
    """A quarter second (of sleep) a step: train-B still runs when the test has seen its first step and kills orch."""
    data["launcher"]["env"]["MINI_STEP_S"] = "0.25"


def test_kill_9_of_orch_during_train_b_leaves_no_process_frees_the_lock_and_the_audit_writes_nothing(
    tmp_path: Path,
) -> None:
    """kill -9 of `orch launch` while train-B runs: every process of the run ends, the lock is free, `orch audit`
    of the run writes nothing and shows no score, and the next `orch ledger verify` names the orphaned package."""
    proj = make_minimal_project(tmp_path)  # 2 ranks; nothing here is about r3-mini
    protocol = edit_protocol(proj, _paced, name="paced.yaml", source=MINIMAL_PROTOCOL)
    home = tmp_path / "home"
    proc = start(proj, protocol, home)
    wait_for(lambda: run_published(home), 300, "the run directory")
    run_dir = only_run(home)
    wait_for(lambda: steps_done(run_dir, "train-B") >= 1 or proc.poll() is not None, 400, "train-B to run")
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    assert len(run_processes(run_dir.name)) >= 3  # worker, torchrun, ranks
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    wait_for(lambda: not run_processes(run_dir.name), 5, "every process of the run to end")
    assert lock_is_free(tmp_path / "locks")
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
        assert "dev_mse" not in out and "DEV score" not in out
        if as_json:
            doc = json.loads(shown.stdout.strip().splitlines()[-1])
            assert doc["audit"] is None and "dev_score" not in doc
            assert "package train-B: open ledger record without a close (the run crashed or is still running)" in (
                doc["problems"])
    # the audit wrote nothing: no file in the run directory, no ledger record
    assert sorted((p.relative_to(run_dir).as_posix(), p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before
    assert not (run_dir / "audit.json").exists() and not (run_dir / "score.sealed.json").exists()
    assert (home / "ledger" / "ledger.arrows").read_bytes() == ledger_bytes
    # the next ledger verify reports the orphaned run
    shown = subprocess.run(orch("ledger", "verify", "--home", str(home), cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=60)
    assert (f"orphaned: run {run_dir.name} package train-B was opened and never closed (crash or kill)"
            in shown.stdout + shown.stderr)
