"""Pieces of the launch pipeline that need no run: the last passing checks of a protocol, placeholders, sealing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.isolation.sealing import check_seal, seal_arm
from orchestrator.run.run_plan import _announce_version_changes, diagnosed_in, last_passing_checks, substitute
from protocol.errors import FailedError
from protocol.package import Diagnosed
from protocol.results import ChecksResult
from protocol.schema import Checks


def _run(runs: Path, run_id: str, protocol_id: str, started: str, checks: str, torch: str,
         diagnostics: tuple[tuple[str, bool], ...] = (), diagnosed_by: str | None = None) -> None:
    d = runs / run_id
    (d / "packages" / "checks").mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "protocol_id": protocol_id, "started": started,
                                            "packages": [{"name": "checks", "status": checks}]}))
    ran = [{"name": n, "command": ["x"], "ok": ok, "exit_code": 0 if ok else 1, "output_sha256": "0" * 64}
           for n, ok in diagnostics]
    (d / "packages" / "checks" / "result.json").write_text(json.dumps(
        {"schema": "orch.checks/1", "versions": {"torch": torch}, "diagnostics": ran, "precision_ok": True,
         **({"diagnosed_by": diagnosed_by} if diagnosed_by else {})}))


def test_last_passing_checks_of_the_same_protocol(tmp_path: Path) -> None:
    _run(tmp_path, "r1", "p", "2026-01-01T00:00:00Z", "ok", "2.9.1")
    _run(tmp_path, "r2", "p", "2026-02-01T00:00:00Z", "ok", "2.11.0")
    _run(tmp_path, "r3", "p", "2026-03-01T00:00:00Z", "failed", "2.12.0")
    _run(tmp_path, "r4", "q", "2026-04-01T00:00:00Z", "ok", "2.13.0")
    assert last_passing_checks(tmp_path, "p", exclude="r9") == ("r2", {"torch": "2.11.0"})
    assert last_passing_checks(tmp_path, "p", exclude="r2") == ("r1", {"torch": "2.9.1"})
    assert last_passing_checks(tmp_path, "z", exclude="r9") is None


def test_a_later_aa_launch_leaves_its_diagnostics_only_to_a_first_launch_that_ran_them_all(tmp_path: Path) -> None:
    """The run a later A/A launch names is used only when it is of the same (A/A) protocol, its checks passed, and
    it ran every diagnostic and the static graph of this protocol itself, each ok; else the diagnostics run."""
    both = (("topk", True), ("graph", True))
    _run(tmp_path, "first", "aa", "2026-01-01T00:00:00Z", "ok", "2.11.0", both)
    _run(tmp_path, "other", "zz", "2026-01-01T00:00:00Z", "ok", "2.11.0", both)
    _run(tmp_path, "failed", "aa", "2026-01-01T00:00:00Z", "failed", "2.11.0", both)
    _run(tmp_path, "partial", "aa", "2026-01-01T00:00:00Z", "ok", "2.11.0", (("topk", True),))
    _run(tmp_path, "bad", "aa", "2026-01-01T00:00:00Z", "ok", "2.11.0", (("topk", True), ("graph", False)))
    _run(tmp_path, "left", "aa", "2026-01-01T00:00:00Z", "ok", "2.11.0", (), diagnosed_by="first")
    checks = Checks.model_validate({"diagnostics": [{"name": "topk", "command": ["x"]}],
                                    "static_graph": {"name": "graph", "command": ["y"]}})

    def ctx(named: str | None, protocol_checks: Checks = checks, of: bool = True) -> Any:
        calibration = SimpleNamespace(diagnosed_by=named) if of else None
        return SimpleNamespace(run_record=SimpleNamespace(calibration_of=calibration), home=SimpleNamespace(
            runs=tmp_path), loaded=SimpleNamespace(id="aa", protocol=SimpleNamespace(checks=protocol_checks)))

    assert diagnosed_in(ctx("first")) == Diagnosed(run_id="first", versions={"torch": "2.11.0"})
    for named in (None, "other", "failed", "partial", "bad", "left", "absent"):
        assert diagnosed_in(ctx(named)) is None, named
    assert diagnosed_in(ctx("first", of=False)) is None  # the owner's run always runs its own
    assert diagnosed_in(ctx("first", Checks())) is None  # nothing to leave


def test_a_version_change_says_whether_the_diagnostics_were_rerun(tmp_path: Path) -> None:
    """Changed versions since the last passing checks: rerun, unless this A/A launch is back on the versions its
    calibration's first launch passed them under (then that run is named)."""
    _run(tmp_path, "r1", "aa", "2026-01-01T00:00:00Z", "ok", "2.9.1")
    said: list[str] = []
    recorded: list[Any] = []
    ctx = SimpleNamespace(home=SimpleNamespace(runs=tmp_path), loaded=SimpleNamespace(id="aa"), run_id="r2",
                          update_run=lambda **f: recorded.append(f["versions_changed"]))
    for by, words in ((None, "the GPU diagnostics were rerun by this run's checks package"),
                      ("r0", "the GPU diagnostics were not rerun: run r0 passed them under these versions")):
        result = ChecksResult(versions={"torch": "2.11.0"}, diagnostics=[], precision_ok=True, diagnosed_by=by)
        _announce_version_changes(ctx, result, said.append)  # type: ignore[arg-type]
        assert said[-1] == ("environment changed since the last passing checks of this protocol (run r1): torch: "
                            f"2.9.1 -> 2.11.0; {words}")
        assert recorded[-1].since_run == "r1" and recorded[-1].changes == {"torch": ("2.9.1", "2.11.0")}


def test_placeholders_are_substituted_everywhere_in_an_argument() -> None:
    assert substitute(["--out", "{scratch}/init.safetensors", "{x}"], {"scratch": "/s"}) == [
        "--out", "/s/init.safetensors", "{x}"]


def test_seal_is_read_only_and_a_forced_write_is_named(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "train" / "loss.py").write_text("x = 1\n")
    (src / "README.md").write_text("notes\n")
    from manifests.core import hash_tree

    root = hash_tree(src, ["train/**/*.py"]).root
    sealed = seal_arm("candidate", src, ["train/**/*.py"], root, tmp_path / "sealed")
    target = sealed.path / "train" / "loss.py"
    assert not os.access(target, os.W_OK) or os.geteuid() == 0  # root may write anyway: the re-hash catches it
    assert oct(target.stat().st_mode & 0o222) == "0o0"
    check_seal(sealed)
    target.chmod(0o644)
    target.write_text("x = 2\n")
    with pytest.raises(FailedError, match=r"1 changed \(train/loss.py\)"):
        check_seal(sealed)


def test_the_scorer_is_the_baselines_sealed_code_for_every_arm(tmp_path: Path, repo: Path) -> None:
    """Issue 17: arm C's checkpoint is its only input to the score package; the candidate's scorer never runs."""
    from types import SimpleNamespace

    from orchestrator.run.run_plan import PLAN, RunContext, package_spec
    from protocol.schema import load_protocol

    loaded = load_protocol(repo / "protocol" / "r3_mini.yaml")
    sealed = {arm: SimpleNamespace(path=tmp_path / "sealed" / arm) for arm in ("baseline", "candidate")}
    ctx = RunContext(loaded, None, "r1", tmp_path / "run", tmp_path / "scratch", None, {}, {},  # type: ignore[arg-type]
                     sealed=sealed)  # type: ignore[arg-type]
    score = next(p for p in PLAN if p.kind == "score")
    spec = package_spec(ctx, score, None)
    assert {t.arm_label: Path(t.sealed_dir).name for t in spec.score_targets} == {"A": "baseline", "C": "baseline"}
    assert {t.arm_label: Path(t.ckpt_dir).name for t in spec.score_targets} == {"A": "A", "C": "C"}
    assert spec.score_targets[0].argv == spec.score_targets[1].argv  # the baseline's configuration for both
    replay = next(p for p in PLAN if p.name == "watch-C")
    watched = package_spec(ctx, replay, None)
    assert (replay.kind, watched.watch_all, watched.ckpt_dir, Path(watched.sealed_dir).name) == (
        "replay", True, None, "candidate")
    assert [p.name for p in PLAN].index("watch-C") > [p.name for p in PLAN].index("reload-B")  # after the triplet


def test_outcome_step_turns_how_the_run_ended_into_the_result_or_its_one_line(tmp_path: Path) -> None:
    """The pipeline's `outcome` step alone: complete -> the result; failed, interrupted, an OS error -> the error."""
    import errno

    from orchestrator.run.launch import RunEnd, RunFailedError, RunInterruptedError, outcome
    from orchestrator.run.run_plan import RunContext
    from protocol.run_record import HostFingerprint, PackageEntry, RunRecord

    ctx = RunContext(None, None, "r1", tmp_path / "run", tmp_path / "scratch", None, {}, {})  # type: ignore[arg-type]
    host = HostFingerprint(gpu_model="none", gpu_count=0, driver="none", cuda="none", torch="2.13.0",
                           triton="3.5.1", python="3.11.7", host_hash="0" * 64)
    entry = PackageEntry(name="checks", kind="checks", arm_label=None, arm=None, env={}, status="failed",
                         note="exit 2: boom")
    ctx.run_record = RunRecord.begin("r1", "p" * 64, "p", "2026-12-01T00:00:00Z", host, {}).with_package(entry)
    done = outcome(ctx, RunEnd("complete", {"checks": "ok"}))
    assert (done.run_id, done.status, done.packages, done.audit) == ("r1", "complete", {"checks": "ok"}, None)
    with pytest.raises(RunFailedError, match=r"^run r1: package checks failed \(exit 2: boom\); later packages not "
                                             r"run, no audit written$") as failed:
        outcome(ctx, RunEnd("failed", {"checks": "failed", "train-A": "not-run"}))
    assert failed.value.result.status == "failed"
    with pytest.raises(RunInterruptedError, match=r"interrupted; its packages are recorded in the ledger$"):
        outcome(ctx, RunEnd("interrupted", {}))
    with pytest.raises(RunFailedError, match=r"^run r1 failed: "):
        outcome(ctx, RunEnd("failed", {}, OSError(errno.ENOSPC, "No space left on device")))


def test_an_arms_config_reaches_only_its_own_trainers_after_the_launchers_arguments(tmp_path: Path, repo: Path) -> None:
    """`arms.X.config` is passed as `--key value` after the launcher's arguments, to that arm's train packages only
    (the end-to-end failing-package launch proves that a package which fails stops the run; this, what it set)."""
    from types import SimpleNamespace

    import yaml

    from orchestrator.run.run_plan import PLAN, RunContext, package_spec
    from protocol.schema import load_protocol

    data = yaml.safe_load((repo / "protocol" / "r3_mini.yaml").read_text())
    data["base"] = str(repo)
    data["arms"]["candidate"]["config"] = {"no_such_flag": "1", "a_flag": "x y"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    loaded = load_protocol(path)
    sealed = {arm: SimpleNamespace(path=tmp_path / "sealed" / arm) for arm in ("baseline", "candidate")}
    ctx = RunContext(loaded, None, "r1", tmp_path / "run", tmp_path / "scratch", None, {}, {},  # type: ignore[arg-type]
                     sealed=sealed)  # type: ignore[arg-type]
    args = {p.name: package_spec(ctx, p, None).args for p in PLAN if p.kind in ("train", "replay")}
    n = len(loaded.protocol.launcher.args)
    for name in ("train-C", "watch-C"):
        assert args[name][n:] == ["--a_flag", "x y", "--no_such_flag", "1"], name
    for name in ("train-A", "train-B"):
        assert len(args[name]) == n and "--no_such_flag" not in args[name], name
