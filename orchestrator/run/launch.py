"""`orch launch` as a pipeline of steps: load -> verify -> fingerprint -> open the run -> lock -> seal -> run the plan
(orchestrator/run/run_plan.py) -> close -> audit. Each step takes and returns typed state and can be called alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.cost.salt import host_hash
from ledger.cost.store import Ledger
from ledger.cost.witness import check_witnessed, record_head, repository_root
from manifests.core import diff_manifests, hash_tree, load_manifest
from manifests.sources import arm_source_dir
from orchestrator.init.script_check import check_script
from orchestrator.isolation import interrupts
from orchestrator.isolation.package_isolation import private_tmp_problem
from orchestrator.isolation.sealing import orch_packages, seal_arm, shadowing, unseal_for_removal
from orchestrator.lock import gpu_lock
from orchestrator.run.fingerprint import fingerprint_changes, host_fingerprint, last_run_fingerprint
from orchestrator.run.forecast import forecast
from orchestrator.run.housekeeping import STAGING_PREFIX, remove_stale_scratch, report_orphans
from orchestrator.run.preflight import require_worker_packages
from orchestrator.run.progress import Progress
from orchestrator.run.run_plan import RunContext, VerifiedArm, run_plan, trainer_command
from orchestrator.run.sequential_launch import begin as begin_sequential
from orchestrator.slurm import cluster as slurm
from protocol.errors import FailedError, InterruptedRunError, OrchError, RefusedError, UsageError, os_error_line
from protocol.fileio import write_atomic
from protocol.home import Home, resolve_home
from protocol.plan import ARMS
from protocol.recipe import RUN_COPY as RECIPE_RUN_COPY
from protocol.run_record import ArmRecord, CalibrationOf, HostFingerprint, LockRecord, RunRecord, SlurmRecord
from protocol.schema import Arm, LoadedProtocol, load_protocol
from protocol.schema import canonical_json as protocol_canonical_json


@dataclass
class LaunchResult:
    run_id: str
    run_dir: Path
    status: str  # complete | failed | interrupted
    packages: dict[str, str]
    audit: dict[str, Any] | None = None
    messages: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": self.status,
            "run_dir": str(self.run_dir),
            "packages": self.packages,
            "verdict": None if self.audit is None else self.audit.get("verdict"),
        }


class RunFailedError(FailedError):
    """A run that stopped before it was complete (exit 1); carries what was recorded for --json."""

    def __init__(self, message: str, result: LaunchResult) -> None:
        super().__init__(message)
        self.result = result


class RunInterruptedError(InterruptedRunError):
    def __init__(self, message: str, result: LaunchResult) -> None:
        super().__init__(message)
        self.result = result


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_run_id(protocol_id: str) -> str:
    return f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{protocol_id[:8]}-{secrets.token_hex(2)}"


def verify_arms(loaded: LoadedProtocol, workdir: Path, say: Callable[[str], None]) -> dict[str, VerifiedArm]:
    """Hash each arm's sources and compare with its commitment (exit 3 with the diff when they differ); its script
    is in its tree and takes every flag orch passes (orchestrator/init/script_check.py)."""
    include = list(loaded.protocol.sources.include)
    out: dict[str, VerifiedArm] = {}
    said: set[str] = set()
    for name in ARMS:
        arm: Arm = getattr(loaded.protocol.arms, name)
        commitment_path = loaded.resolve(arm.commitment)
        commitment = load_manifest(commitment_path)
        src = arm_source_dir(loaded, arm, workdir / name)
        shadows = shadowing(src, loaded.protocol.launcher.env.get("PYTHONPATH", ""))
        if shadows:
            raise RefusedError(
                f"{name} sources hold {', '.join(shadows)}: the name of one of orch's own packages "
                f"({', '.join(orch_packages())}); orch's workers and probe import theirs, so rename it or move it "
                "out of the sealed tree")
        actual = hash_tree(src, include)
        diff = diff_manifests(commitment, actual)
        note = None
        if not diff.equal:
            if not (name == "candidate" and arm.under_evaluation):
                raise RefusedError(
                    f"{name} sources differ from {arm.commitment}: {diff.summary()}; "
                    "run `orch freeze` if this is a new candidate (and declare it under_evaluation)"
                )
            note = f"candidate under evaluation differs from {arm.commitment}: {diff.summary()}"
            say(note)
        unchecked = check_script(loaded, name, arm, src)
        if unchecked is not None and unchecked not in said:  # both arms of one tree: said once
            said.add(unchecked)
            say(unchecked)
        out[name] = VerifiedArm(name, arm, src, commitment.root, actual.root, note)
    return out


@contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGINT to orch behave like Ctrl-C: the current package is stopped and recorded as interrupted,
    whatever was inherited (a background job of a script starts with SIGINT ignored); orchestrator.isolation.interrupts
    keeps one that arrives while a package is forked, or inside an at-fork hook, from being lost."""

    interrupts.reset()
    old = {sig: signal.signal(sig, interrupts.handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, previous in old.items():
            if previous is not None:
                signal.signal(sig, previous)


def _create_run_dir(run_dir: Path, protocol_json: bytes, record: RunRecord, recipe: bytes | None = None) -> None:
    """The run folder appears complete (protocol.json, the recipe file it names, run.json) or not at all: staged,
    then renamed."""
    staging = run_dir.with_name(STAGING_PREFIX + run_dir.name)
    try:
        staging.mkdir()
        write_atomic(staging / "protocol.json", protocol_json)
        if recipe is not None:
            write_atomic(staging / RECIPE_RUN_COPY, recipe)
        write_atomic(staging / "run.json", record.to_bytes())
        os.rename(staging, run_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@dataclass(frozen=True)
class Prepared:
    """What `load` leaves: the validated protocol, the home, and its ledger (verified, witnessed heads extended)."""

    loaded: LoadedProtocol
    home: Home
    ledger: Ledger


@dataclass(frozen=True)
class RunEnd:
    """How the packages under the lock ended: complete | failed | interrupted, each package's status, an OS error."""

    status: str
    statuses: dict[str, str]
    os_failure: OSError | None = None


def load(protocol_path: Path, loaded: LoadedProtocol | None = None) -> LoadedProtocol:
    """Load and validate the protocol, look up the worker packages: refusals (exit 3) that write nothing."""
    loaded = loaded or load_protocol(protocol_path)
    require_worker_packages(loaded)
    problem = private_tmp_problem()
    if problem is not None:
        raise RefusedError(problem)
    return loaded


def open_home(loaded: LoadedProtocol, home_dir: Path | None) -> Prepared:
    """Create the home (a refused launch never gets here, so it writes nothing into the project) and verify its
    ledger: a damaged one is refused (exit 1) before any lock, run directory or ledger record."""
    home = resolve_home(home_dir)
    home.create()
    ledger = Ledger(home.ledger_path)
    report = ledger.verify()
    if not report.ok:  # never append to a damaged ledger: before any lock or package
        raise FailedError(f"{report.message}; nothing was run or appended ({home.ledger_path})")
    check_witnessed(home, ledger, repository_root(Path.cwd()))
    return Prepared(loaded, home, ledger)


def fingerprint(home: Home, say: Callable[[str], None]) -> HostFingerprint:
    """This host's fingerprint (the name only as a salted hash); says what changed since the last run."""
    host = HostFingerprint.model_validate(host_fingerprint(host_hash(home.ledger_dir)))
    previous = last_run_fingerprint(home.runs)
    if previous is not None:
        changes = fingerprint_changes(previous[1], host.model_dump())
        if changes:
            say(f"host fingerprint changed since run {previous[0]} ({'; '.join(changes)}); "
                "this run records both baselines (A and B) fresh before anything is compared")
    return host


def open_run(
    prep: Prepared, arms: dict[str, VerifiedArm], host: HostFingerprint, owner: contextlib.ExitStack,
    calibration_of: CalibrationOf | None, say: Callable[[str], None],
) -> RunContext:
    """A new run id, held by this process until the run ends; its folder with protocol.json and run.json."""
    loaded = prep.loaded
    run_id = new_run_id(loaded.id)
    owner.enter_context(prep.home.hold_owner(run_id))  # held until the run ends: others see it live
    run_dir = prep.home.run_dir(run_id)
    scratch = prep.home.scratch / run_id
    ctx = RunContext(loaded, prep.home, run_id, run_dir, scratch, prep.ledger, host, arms)
    ctx.run_record = RunRecord.begin(
        run_id, loaded.id, loaded.protocol.name, _utc_now(), host,
        {name: ArmRecord(commitment=a.spec.commitment, commitment_root=a.commitment_root,
                         sources_root=a.sources_root, switches=dict(a.spec.switches), config=dict(a.spec.config),
                         source=a.spec.source if a.spec.source == "tree" else {"git": a.spec.source.git},
                         under_evaluation=a.spec.under_evaluation, note=a.note,
                         command=trainer_command(loaded, a.spec))
         for name, a in arms.items()},
        calibration_of,
    )
    recipe = loaded.frozen_recipe().raw if loaded.protocol.recipe_file is not None else None  # /1: R3's, in orch
    _create_run_dir(run_dir, protocol_canonical_json(loaded.protocol), ctx.run, recipe)
    scratch.mkdir(parents=True)
    say(f"run {run_id}")
    return ctx


def lock(
    ctx: RunContext, lock_timeout: float | None, lock_dir: Path | None, say: Callable[[str], None]
) -> gpu_lock.Grant | slurm.Allocation:
    """The whole run's devices: the Slurm allocation, the GPU lock, or CPU slots; when none is had, every package
    is recorded `not-run` and run.json `failed` before the error goes on."""
    launcher = ctx.loaded.protocol.launcher
    need = launcher.nproc if launcher.device == "cuda" else None
    try:
        if launcher.slurm is not None:  # the scheduler owns the GPUs: never orch's own lock
            allocation = slurm.enter_allocation(launcher.slurm, say)
            ctx.slurm = slurm.SlurmRun(allocation, ctx.run_id, ctx.home.ledger_dir)
            return allocation
        if need:
            return gpu_lock.acquire(gpus=need or 1, timeout=lock_timeout, lock_dir=lock_dir, status=say,
                                    slots=None, command=f"orch launch {ctx.run_id}")
        return _cpu_grant(launcher.nproc, lock_timeout, lock_dir, say, ctx.run_id)
    except BaseException:
        for pkg in ctx.plan:
            ctx.record(pkg, "not-run", note="GPU lock not obtained")
        ctx.update_run(status="failed", ended=_utc_now())
        ctx.write_run_json()
        record_head(ctx.home, ctx.ledger, f"launch {ctx.run_id}")
        raise


def held(ctx: RunContext, grant: gpu_lock.Grant | slurm.Allocation, say: Callable[[str], None]) -> None:
    """With the lock held: report orphaned runs (a run still holding the lock was live), remove stale scratch."""
    ctx.grant = grant
    report_orphans(ctx.home, ctx.ledger, say)
    remove_stale_scratch(ctx.home, say)
    ctx.update_run(lock=LockRecord(kind=grant.kind, devices=grant.devices, wait_s=round(grant.wait_s, 6)))
    say(f"lock: {grant.kind} {','.join(map(str, grant.devices))} after {grant.wait_s:.1f} s")


def seal(ctx: RunContext) -> None:
    """A read-only copy of each arm's verified sources, hashed; its manifest beside it; run.json records the seals."""
    include = list(ctx.loaded.protocol.sources.include)
    for name, arm in ctx.arms.items():
        ctx.sealed[name] = seal_arm(name, arm.source_dir, include, arm.sources_root, ctx.run_dir / "sealed" / name)
        sealed = ctx.sealed[name]  # the seal covers every file; sources_root the included ones
        write_atomic(ctx.run_dir / "sealed" / f"{name}.manifest.json", sealed.manifest.to_json().encode())
        ctx.run_record = ctx.run.with_arm(name, sealed_root=sealed.manifest.root,
                                          beyond_include=sealed.beyond_include())
    ctx.write_run_json()
    if ctx.slurm is not None:
        ctx.update_run(slurm=SlurmRecord(job_id=ctx.slurm.alloc.job_id, nodes=[
            slurm.node_hash(ctx.home.ledger_dir, n) for n in ctx.slurm.alloc.nodes]))
        ctx.write_run_json()


def run_under_lock(
    ctx: RunContext, lock_timeout: float | None, lock_dir: Path | None, live: bool | None,
    say: Callable[[str], None],
) -> RunEnd:
    """lock -> seal -> run the plan, with SIGINT/SIGTERM as Ctrl-C; an interrupt or an OS error closes every
    record that is still open (or never opened) before it is reported."""
    progress = Progress(live=live, say=say)
    status = "failed"
    statuses: dict[str, str] = {}
    try:
        with _signals_as_interrupt():
            grant = lock(ctx, lock_timeout, lock_dir, say)
            with grant:
                held(ctx, grant, say)
                try:
                    seal(ctx)
                    with progress:
                        try:
                            status, statuses = run_plan(ctx, progress)
                        finally:
                            _clean_scratch(ctx.scratch)
                finally:
                    _record_held(ctx, grant)
    except KeyboardInterrupt:
        for pkg in ctx.plan:  # an interrupt outside a package (e.g. while sealing): close every record
            if pkg.name not in ctx.closed and ctx.grant is not None:
                ctx.record(pkg, "interrupted" if pkg.name in ctx.opened else "not-run", note="interrupted")
        return RunEnd("interrupted", statuses)
    except OSError as err:  # e.g. a full disk: close what can be closed, then one line
        with contextlib.suppress(OSError, OrchError):
            for pkg in ctx.plan:
                if pkg.name not in ctx.closed and ctx.grant is not None:
                    ctx.record(pkg, "failed" if pkg.name in ctx.opened else "not-run", note=os_error_line(err))
        return RunEnd("failed", statuses, err)
    return RunEnd(status, statuses)


def _record_held(ctx: RunContext, grant: gpu_lock.Grant | slurm.Allocation) -> None:
    """How long the lock was held (the packages, and orch's seals, checks and cleanup between them), in run.json's
    lock record: the audit accounts the GPU-seconds held outside any package. A Slurm allocation has no such clock."""
    held_s = getattr(grant, "held_s", None)
    if held_s is None or ctx.run.lock is None:
        return
    ctx.update_run(lock=ctx.run.lock.model_copy(update={"held_s": round(held_s(), 6)}))
    with contextlib.suppress(OSError):  # a full disk: close_run writes run.json again, and says so
        ctx.write_run_json()


def close_run(ctx: RunContext, end: RunEnd) -> None:
    """run.json's final status and a witnessed head of the ledger (outside the ledger file: see `orch audit`)."""
    ctx.update_run(status=end.status, ended=_utc_now())
    try:
        ctx.write_run_json()
        record_head(ctx.home, ctx.ledger, f"launch {ctx.run_id}")
    except OSError:
        if end.os_failure is None:
            raise


def outcome(ctx: RunContext, end: RunEnd) -> LaunchResult:
    """The launch's result when the run is complete; otherwise the one-line error of how it stopped."""
    result = LaunchResult(ctx.run_id, ctx.run_dir, end.status, end.statuses)
    if end.os_failure is not None:
        raise RunFailedError(f"run {ctx.run_id} failed: {os_error_line(end.os_failure)}", result)
    if end.status == "interrupted":
        raise RunInterruptedError(f"run {ctx.run_id} interrupted; its packages are recorded in the ledger", result)
    if end.status != "complete":
        statuses = end.statuses
        failed = next((n for n, s in statuses.items() if s not in ("ok", "not-run")), "?")
        entry = ctx.run.package(failed)
        note = None if entry is None else entry.note
        raise RunFailedError(f"run {ctx.run_id}: package {failed} {statuses.get(failed)}"
                             + (f" ({note})" if note else "") + "; later packages not run, no audit written", result)
    return result


def audit(ctx: RunContext, result: LaunchResult, say: Callable[[str], None]) -> LaunchResult:
    """The evidence is complete: the audit is computed and written now, before anyone reads a quality metric."""
    from ledger.verdict.documents.audit import audit_run

    audited = audit_run(ctx.home.root, ctx.run_id)
    result.audit = audited.document
    say(f"audit: {audited.verdict} ({ctx.run_dir / 'audit.md'})")
    return result


def launch(
    protocol_path: Path, home_dir: Path | None = None, say: Callable[[str], None] = print,
    lock_timeout: float | None = None, lock_dir: Path | None = None, live: bool | None = None,
    loaded: LoadedProtocol | None = None, calibration_of: CalibrationOf | None = None,
    until_decided: int | None = None,
) -> LaunchResult:
    """The whole pipeline of DESIGN.md section 3; refusals (exit 3) happen before the GPU lock is asked for.

    `loaded` runs a protocol derived in memory (the A/A run of `orch calibrate`, named in `calibration_of`).
    `until_decided`: the most triplets of the sequential rule asked for by `orch launch --until-decided`.
    """
    checked = load(protocol_path, loaded)
    if until_decided is not None and checked.protocol.measurement.sequential:
        raise UsageError(f"--until-decided: {protocol_path} already has measurement.repeats: auto (at most "
                         f"{checked.protocol.measurement.max_repeats} triplets); drop --until-decided")
    with tempfile.TemporaryDirectory(prefix="orch-verify-") as tmp, contextlib.ExitStack() as owner:
        arms = verify_arms(checked, Path(tmp), say)
        prep = open_home(checked, home_dir)  # every refusal above writes nothing, not even the home
        host = fingerprint(prep.home, say)
        ctx = open_run(prep, arms, host, owner, calibration_of, say)
        begin_sequential(ctx, until_decided, say)
        forecast(ctx, ctx.sequential.rule.max_triplets if ctx.sequential is not None else None, say)
        end = run_under_lock(ctx, lock_timeout, lock_dir, live, say)
        close_run(ctx, end)
    return audit(ctx, outcome(ctx, end), say)


def _cpu_grant(nproc: int, timeout: float | None, lock_dir: Path | None, say: Callable[[str], None],
               run_id: str) -> gpu_lock.Grant:
    """CPU runs lock CPU slots (one per rank, at most the host's cores) through the same lock as GPUs."""
    slots = gpu_lock.resolve_slots(None)
    return gpu_lock.acquire(gpus=min(nproc, slots), timeout=timeout, lock_dir=lock_dir, status=say,
                            probe=_NoGpus(), command=f"orch launch {run_id}")


class _NoGpus:
    """A device probe that sees no GPU, so that a CPU protocol locks CPU slots even on a GPU host."""

    def count(self) -> int:
        return 0

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        return []


def _clean_scratch(scratch: Path) -> None:
    """Checkpoints never reach evidence: the run's scratch is deleted when its packages end."""
    if scratch.exists():
        unseal_for_removal(scratch)
        shutil.rmtree(scratch, ignore_errors=True)
