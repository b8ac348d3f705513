"""The run-the-plan step (`orchestrator.run.run_plan.run_plan`) on real files: sealed copies, a ledger, a CPU-slot lock.

Only the package runner is replaced (it would start a trainer); the rules under test are the launch's own: stop on
the first failure with every later package recorded not-run, and the sealed copy re-hashed after each package.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ledger.cost.store import Ledger
from manifests.core import hash_tree
from orchestrator.isolation.packages import PackageOutcome
from orchestrator.isolation.sealing import seal_arm
from orchestrator.run import run_plan as run_plan_mod
from orchestrator.run.launch import _cpu_grant
from orchestrator.run.progress import Progress
from orchestrator.run.run_plan import PLAN, RunContext, VerifiedArm, run_plan
from protocol.home import resolve_home
from protocol.run_record import HostFingerprint, RunRecord
from protocol.schema import load_protocol

REPO = Path(__file__).resolve().parents[2]
NAMES = [p.name for p in PLAN]
TS = "2026-01-01T00:00:00Z"
Behaviour = Callable[[Any, RunContext], str]


@pytest.fixture
def ctx(tmp_path: Path) -> Iterator[RunContext]:
    loaded = load_protocol(REPO / "protocol" / "r3_mini.yaml")
    home = resolve_home(tmp_path / "home")
    for d in (home.runs, home.ledger_dir, home.scratch):
        d.mkdir(parents=True, exist_ok=True)
    include = list(loaded.protocol.sources.include)
    run_id = "run1"
    run_dir = home.run_dir(run_id)
    (run_dir / "packages").mkdir(parents=True)
    scratch = home.scratch / run_id
    scratch.mkdir(parents=True)
    arms: dict[str, VerifiedArm] = {}
    for name in ("baseline", "candidate"):
        src = tmp_path / "src" / name
        for sub in ("modeling", "train"):
            (src / sub).mkdir(parents=True)
        (src / "modeling" / "model.py").write_text(f"# the model of the {name}\n")
        (src / "train" / "online_rl.py").write_text(f"# the trainer of the {name}\n")
        root = hash_tree(src, include).root
        arms[name] = VerifiedArm(name, getattr(loaded.protocol.arms, name), src, root, root)
    host = HostFingerprint(gpu_model="none", gpu_count=0, driver="none", cuda="none", torch="2.13.0",
                           triton="3.5.1", python="3.11.7", host_hash="0" * 64)
    c = RunContext(loaded, home, run_id, run_dir, scratch, Ledger(home.ledger_path), host, arms)
    c.run_record = RunRecord.begin(run_id, loaded.id, loaded.protocol.name, "2026-12-01T00:00:00Z", host, {})
    for name, arm in arms.items():
        c.sealed[name] = seal_arm(name, arm.source_dir, include, arm.sources_root, run_dir / "sealed" / name)
    grant = _cpu_grant(loaded.protocol.launcher.nproc, 10.0, tmp_path / "locks", lambda _: None, run_id)
    with grant:
        c.grant = grant
        yield c


def _runner(ctx: RunContext, ran: list[str], behaviour: dict[str, Behaviour]) -> Callable[..., PackageOutcome]:
    """A package runner that writes what a worker writes (result.json, the sealed score) and returns its status."""

    def run_package(spec: Any, env: dict[str, str], timeout: float, on_tick: Any = None, **_: Any) -> PackageOutcome:
        ran.append(spec.name)
        pkg_dir = Path(spec.package_dir)
        pkg_dir.mkdir(parents=True, exist_ok=True)
        (pkg_dir / "result.json").write_text(json.dumps({"name": spec.name}) + "\n")
        if spec.kind == "score":
            (ctx.run_dir / "score.sealed.json").write_text("{}\n")
        status = behaviour[spec.name](spec, ctx) if spec.name in behaviour else "ok"
        return PackageOutcome(name=spec.name, status=status, exit_code=0 if status == "ok" else 1, wall_s=1.0,
                              started=TS, ended=TS)

    return run_package


def _closes(ctx: RunContext) -> dict[str, tuple[str, str | None]]:
    return {r.package: (r.status, r.note) for r in Ledger(ctx.home.ledger_path).records(ctx.run_id)
            if r.status != "open"}


def _opens(ctx: RunContext) -> list[str]:
    return [r.package for r in Ledger(ctx.home.ledger_path).records(ctx.run_id) if r.status == "open"]


def _run(ctx: RunContext, monkeypatch: pytest.MonkeyPatch,
         behaviour: dict[str, Behaviour]) -> tuple[str, dict[str, str], list[str]]:
    ran: list[str] = []
    monkeypatch.setattr(run_plan_mod, "run_package", _runner(ctx, ran, behaviour))
    status, statuses = run_plan(ctx, Progress(live=False, say=lambda _: None))
    return status, statuses, ran


def test_every_package_runs_in_order_when_all_pass(ctx: RunContext, monkeypatch: pytest.MonkeyPatch) -> None:
    status, statuses, ran = _run(ctx, monkeypatch, {})
    assert status == "complete" and ran == NAMES
    assert statuses == dict.fromkeys(NAMES, "ok")
    closes = _closes(ctx)
    assert _opens(ctx) == NAMES and closes == {n: ("ok", closes["prime"][1] if n == "prime" else None) for n in NAMES}
    # the prime's record holds the sha256 of the manifest of the cache it sealed (a later run checks a kept cache)
    manifest = hashlib.sha256((ctx.run_dir / "compile-cache.baseline.json").read_bytes()).hexdigest()
    assert closes["prime"][1] == f"compile cache sealed: 2 entries, manifest sha256 {manifest}"


@pytest.mark.parametrize("failing", ["checks", "train-C", "reload-B"])
def test_the_first_failure_stops_the_run_and_later_packages_are_recorded_not_run(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    # every package after the failed one would fail too, loudly: none of them may even be started
    later = NAMES[NAMES.index(failing) + 1:]
    behaviour: dict[str, Behaviour] = {failing: lambda spec, c: "failed"}
    behaviour.update({name: lambda spec, c: pytest.fail(f"{spec.name} ran after {failing} failed") for name in later})
    status, statuses, ran = _run(ctx, monkeypatch, behaviour)
    assert status == "failed"
    assert ran == NAMES[: NAMES.index(failing) + 1]
    assert _opens(ctx) == ran  # nothing after the failure was opened
    closes = _closes(ctx)
    assert closes[failing] == ("failed", None)
    assert {n: closes[n] for n in later} == {n: ("not-run", f"not reached: {failing} failed") for n in later}
    assert statuses == {**dict.fromkeys(ran, "ok"), failing: "failed", **dict.fromkeys(later, "not-run")}


def test_an_interrupted_package_makes_an_interrupted_run(ctx: RunContext, monkeypatch: pytest.MonkeyPatch) -> None:
    status, _, ran = _run(ctx, monkeypatch, {"train-A": lambda spec, c: "interrupted"})
    assert status == "interrupted" and ran == ["checks", "prime", "train-A"]
    assert _closes(ctx)["reload-A"] == ("not-run", "not reached: train-A interrupted")


def _write_into_sealed(arm: str) -> Behaviour:
    """The package reports ok, but something wrote into a sealed copy while it ran (root can despite read-only)."""

    def behave(spec: Any, c: RunContext) -> str:
        target = c.sealed[arm].path / "train" / "online_rl.py"
        target.chmod(0o644)
        target.write_text("# written during the run\n")
        return "ok"

    return behave


@pytest.mark.parametrize("writer", NAMES)
def test_a_write_into_the_sealed_copy_during_any_package_fails_that_package(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch, writer: str
) -> None:
    pkg = next(p for p in PLAN if p.name == writer)
    arm = pkg.arm or "candidate"  # checks and score use both arms: both copies are re-hashed after them
    status, statuses, ran = _run(ctx, monkeypatch, {writer: _write_into_sealed(arm)})
    assert status == "failed" and ran == NAMES[: NAMES.index(writer) + 1]
    assert statuses[writer] == "failed"
    assert _closes(ctx)[writer] == ("failed", f"sealed copy of {arm} was modified during the run: "
                                              "1 changed (train/online_rl.py)")
    assert all(_closes(ctx)[n][0] == "not-run" for n in NAMES[NAMES.index(writer) + 1:])


@pytest.mark.parametrize(("writer", "other"), [("train-C", "baseline"), ("reload-C", "baseline"),
                                                ("train-A", "candidate")])
def test_a_package_that_writes_into_the_other_arms_sealed_copy_fails_before_that_arm_runs(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch, writer: str, other: str
) -> None:
    # found by the attack battery: train-C slowed the sealed baseline, and train-B ran it before the re-hash
    status, _, ran = _run(ctx, monkeypatch, {writer: _write_into_sealed(other)})
    assert status == "failed" and ran == NAMES[: NAMES.index(writer) + 1]
    assert _closes(ctx)[writer] == ("failed", f"sealed copy of {other} was modified during the run: "
                                              "1 changed (train/online_rl.py)")


def test_an_os_error_in_a_replicated_run_closes_that_runs_own_packages(
    ctx: RunContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    # repeats 2: packages train-A1 ... score; a full disk during train-B1 must close train-B1 failed and every later
    # package of this plan not-run, and record nothing under the names of the one-triplet plan (train-A, ...)
    import errno

    from orchestrator.run import launch as launch_mod
    from protocol.plan import plan as plan_of

    two = plan_of(2)
    monkeypatch.setattr(RunContext, "plan", property(lambda self: two))
    real = ctx.grant

    class Held:  # the fixture's CPU-slot grant, already held: the step under test must not take a second one
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def __enter__(self) -> Held:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

    monkeypatch.setattr(launch_mod, "lock", lambda *a, **k: Held())
    monkeypatch.setattr(launch_mod, "seal", lambda c: None)  # the fixture sealed both arms already

    def behave(spec: Any, c: RunContext) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    ran: list[str] = []
    monkeypatch.setattr(run_plan_mod, "run_package", _runner(ctx, ran, {"train-B1": behave}))
    end = launch_mod.run_under_lock(ctx, None, None, False, lambda _: None)
    names = [p.name for p in two]
    assert end.status == "failed" and ran == names[: names.index("train-B1") + 1]
    closes = _closes(ctx)
    assert set(closes) == set(names)  # every package of this run closed, no record under another plan's names
    assert closes["train-B1"][0] == "failed" and "No space left on device" in (closes["train-B1"][1] or "")
    assert all(closes[n][0] == "not-run" for n in names[names.index("train-B1") + 1:])
    assert set(_opens(ctx)) == set(ran)
