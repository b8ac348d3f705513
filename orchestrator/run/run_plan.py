"""Running the plan of one run: its context (RunContext: the run's directory, ledger, lock, seals, run.json), each
package's sealed spec, and the loop that runs the packages in order, stopping at the first failure.

Every package gets an open and a close ledger record; packages never reached are recorded `not-run`.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ledger.cost.store import Ledger
from orchestrator.isolation import kept_cache
from orchestrator.isolation.blinding import quarantine, seal_outputs, special_entries
from orchestrator.isolation.compile_cache import RunCaches
from orchestrator.isolation.packages import (
    PackageOutcome,
    env_summary,
    fail_outcome,
    package_env,
    probe_progress,
    run_package,
    utc_now,
)
from orchestrator.isolation.safe_paths import (
    UnsafeEntry,
    file_fingerprint,
    fingerprint_changes,
    seal_checkpoint,
    stat_fingerprint,
)
from orchestrator.isolation.sealing import SealedArm, check_seal, unseal_for_removal
from orchestrator.lock import gpu_lock
from orchestrator.run.host_watch import HostWatcher, package_devices
from orchestrator.run.progress import Progress
from orchestrator.run.sequential_launch import SequentialState, after_triplet
from orchestrator.run.startup import startup_phases
from orchestrator.slurm import cluster as slurm
from protocol.errors import FailedError
from protocol.fileio import write_atomic
from protocol.hashing import sha256_file
from protocol.home import Home
from protocol.package import (
    ChecksSpec,
    CommandSpec,
    Diagnosed,
    PackageSpec,
    ReloadSpec,
    ScoreSpec,
    ScoreTarget,
    TrainSpec,
)
from protocol.plan import PlannedPackage, kept_checkpoints, plan, score_labels
from protocol.results import ChecksResult, TrainResult
from protocol.run_record import CacheUse, EarlierRun, HostFingerprint, PackageEntry, RunRecord, VersionsChanged
from protocol.schema import Arm, LoadedProtocol

PLAN = plan(1)  # the owner's run; a protocol with measurement.repeats K runs plan(K), a sequential one grows it
WATCH_TIMEOUT_FACTOR = 3  # the watched replay runs every op through the dispatch watch: slower than train


@dataclass
class VerifiedArm:
    name: str
    spec: Arm
    source_dir: Path
    commitment_root: str
    sources_root: str
    note: str | None = None


def substitute(argv: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for a in argv:
        for key, value in values.items():
            a = a.replace("{" + key + "}", value)
        out.append(a)
    return out


def _arm_args(loaded: LoadedProtocol, arm: Arm) -> list[str]:
    extra = [x for key, value in sorted(arm.config.items()) for x in (f"--{key}", value)]
    return [*loaded.protocol.launcher.args, *extra]


def trainer_command(loaded: LoadedProtocol, arm: Arm) -> list[str]:
    """The trainer's command line of an arm (run.json): script, recipe flags, launcher.args, the arm's config."""
    return [loaded.protocol.launcher.script, *_arm_args(loaded, arm)]


@dataclass
class RunContext:
    loaded: LoadedProtocol
    home: Home
    run_id: str
    run_dir: Path
    scratch: Path
    ledger: Ledger
    host: HostFingerprint
    arms: dict[str, VerifiedArm]
    sealed: dict[str, SealedArm] = field(default_factory=dict)
    grant: gpu_lock.Grant | slurm.Allocation | None = None
    slurm: slurm.SlurmRun | None = None  # launcher.scheduler slurm: the allocation's steps and per-node seal checks
    run_record: RunRecord | None = None  # run.json; set by the launch's open_run step
    opened: set[str] = field(default_factory=set)
    closed: set[str] = field(default_factory=set)
    # repeats: auto or --until-decided (orchestrator/run/sequential_launch.py)
    sequential: SequentialState | None = None
    caches: RunCaches | None = None  # the run's compile caches, made when the plan starts
    kept: kept_cache.KeptRecord | None = None  # a kept baseline cache this run loads instead of priming (issue 51)
    kept_reason: str | None = None  # why no kept cache served (then the prime runs, and its cache is kept)
    kept_key: str = ""
    kept_fields: dict[str, Any] = field(default_factory=dict)
    # each kept checkpoint's entries (kind, inode, size, mtime, ctime) once its train package passed: checked
    # before and after every later package (orchestrator/isolation/safe_paths.stat_fingerprint)
    checkpoints: dict[str, dict[str, tuple[str, int, int, int, int]]] = field(default_factory=dict)
    # the shared initial state's (mode, inode, size, mtime, ctime) once the checks made it: compared before and
    # after every package, and its SHA256 after the last package that reads it (_check_sealed)
    init_stat: tuple[int, int, int, int, int] | None = None

    @property
    def shape(self) -> tuple[int, bool]:
        """(triplets in the plan, sequential): a sequential run's plan grows by one triplet per look."""
        if self.sequential is not None:
            return self.sequential.planned, True
        return self.loaded.protocol.measurement.fixed_repeats or 1, False

    @property
    def primes(self) -> bool:
        """The plan has a prime package: measurement.compile: prime (the default), and no kept cache served."""
        return self.loaded.protocol.measurement.compile == "prime" and self.kept is None

    @property
    def calibrates(self) -> bool:
        """An A/A launch of `orch calibrate`: the plan ends after its triplet (no watched replay, no scorer)."""
        return self.run_record is not None and self.run_record.calibration_of is not None

    @property
    def plan(self) -> tuple[PlannedPackage, ...]:
        return plan(*self.shape, prime=self.primes, calibration=self.calibrates)

    @property
    def gpus(self) -> int:
        if isinstance(self.grant, slurm.Allocation):
            return self.grant.gpus
        return len(self.grant.devices) if self.grant is not None and self.grant.kind == "gpu" else 0

    @property
    def run(self) -> RunRecord:
        assert self.run_record is not None, "the run record is made by open_run"
        return self.run_record

    def update_run(self, **fields: Any) -> None:
        """run.json's top-level fields (status, ended, lock, slurm, versions_changed), in memory until written."""
        self.run_record = self.run.updated(**fields)

    def write_run_json(self) -> None:
        write_atomic(self.run_dir / "run.json", self.run.to_bytes())

    def record(self, pkg: PlannedPackage, status: str, **fields: Any) -> None:
        (self.opened if status == "open" else self.closed).add(pkg.name)
        arm = pkg.arm
        sources_root = self.arms[arm].sources_root if arm else None
        self.ledger.append(
            run_id=self.run_id, package=pkg.name, kind=pkg.kind, arm=arm, status=status,
            gpus=self.gpus, host=self.host.host_hash, protocol_id=self.loaded.id, sources_root=sources_root,
            lock_wait_s=None if self.grant is None else round(self.grant.wait_s, 6), **fields,
        )


def trainer_dir(ctx: RunContext, pkg: PlannedPackage) -> Path:
    """`{trainer_dir}`: the trainer's own output folder (its --log_dir), in scratch, sealed after the package."""
    return ctx.scratch / "trainer" / pkg.name


def _placeholders(ctx: RunContext, pkg: PlannedPackage) -> dict[str, str]:
    return {"scratch": str(ctx.scratch), "init": str(ctx.scratch / "init.safetensors"),
            "package_dir": str(ctx.run_dir / "packages" / pkg.name), "trainer_dir": str(trainer_dir(ctx, pkg))}


def package_spec(ctx: RunContext, pkg: PlannedPackage, init_digest: str | None) -> PackageSpec:
    """The sealed spec of one package, of its kind's model (orch.package/2): each kind carries only its fields."""
    p = ctx.loaded.protocol
    pkg_dir = ctx.run_dir / "packages" / pkg.name
    values = _placeholders(ctx, pkg)
    common: dict[str, Any] = {
        "run_id": ctx.run_id, "name": pkg.name, "arm_label": pkg.arm_label, "arm": pkg.arm,
        "package_dir": str(pkg_dir), "scratch_dir": str(ctx.scratch), "result_path": str(pkg_dir / "result.json"),
        "device": p.launcher.device, "precision": p.precision, "nproc": p.launcher.world_size,
        "backend": p.launcher.backend,
    }
    inputs = {"init": init_digest} if init_digest else {}
    if pkg.kind == "checks":
        def cmd(d: Any) -> CommandSpec:
            return CommandSpec(name=d.name, argv=substitute(list(d.command), values), expect_sha256=d.expect_sha256)

        return ChecksSpec(
            **common, sealed_dir=str(ctx.sealed["baseline"].path),
            prepare=[cmd(d) for d in p.checks.prepare], diagnostics=[cmd(d) for d in p.checks.diagnostics],
            static_graph=None if p.checks.static_graph is None else cmd(p.checks.static_graph),
            diagnosed=diagnosed_in(ctx),
        )
    if pkg.kind == "score":
        targets = []
        for label in score_labels(*ctx.shape):
            ckpt = ctx.scratch / "ckpt" / label
            argv = substitute(list(p.scorer.command), values)  # {ckpt} and {out} are the score worker's to fill
            # the scorer is the baseline's committed code and configuration for every arm: a candidate cannot
            # change how it is scored; its checkpoint is the only input from arm C
            targets.append(ScoreTarget(arm_label=label, sealed_dir=str(ctx.sealed["baseline"].path),
                                       ckpt_dir=str(ckpt), argv=argv + _arm_args_config(ctx.loaded, "baseline")))
        return ScoreSpec(**common, sealed_dir=str(ctx.sealed["baseline"].path), inputs=inputs,
                         score_targets=targets, sealed_metrics_path=str(ctx.run_dir / "score.sealed.json"))
    assert pkg.arm is not None
    sealed_dir = str(ctx.sealed[pkg.arm].path)
    if pkg.kind == "prime":  # the baseline's trainer as train-A runs it: same command and digests; no checkpoint
        steps = p.measurement.primed_steps  # at most; without measurement.prime_steps it stops when compiling stops
        return TrainSpec(
            **{**common, "arm": "baseline"}, kind="prime", sealed_dir=sealed_dir, ckpt_dir=None,
            script=p.launcher.script, args=substitute(_arm_args(ctx.loaded, p.arms.baseline), values), inputs=inputs,
            steps=steps, warmup=p.measurement.warmup, window=p.measurement.window,
            digest_first=min(p.measurement.digest_first, steps - 1),
            digest_last=min(p.measurement.digest_last, steps - 1),
            host_controls=list(p.measurement.host_controls), watch_all=False,
            until_compiled=p.measurement.prime_steps is None,
            slurm=None if ctx.slurm is None else ctx.slurm.step(pkg.name, p.launcher.nproc, ctx.scratch),
        )
    assert pkg.arm_label is not None
    ckpt_dir = str(ctx.scratch / "ckpt" / pkg.arm_label)
    if pkg.kind == "reload":
        train_result = ctx.run_dir / "packages" / f"train-{pkg.arm_label}" / "result.json"
        return ReloadSpec(**common, sealed_dir=sealed_dir, ckpt_dir=ckpt_dir,
                          inputs={**inputs, "train_result": sha256_file(train_result)})
    arm_spec: Arm = getattr(p.arms, pkg.arm)
    # the replay is checked by its digests, keeps no second checkpoint of C, and watches the steps train-C did not
    # (warmup..end; train-C watched 0..warmup-1), so its first steps run at full speed
    replay = pkg.kind == "replay"
    return TrainSpec(
        **common, kind="replay" if replay else "train", sealed_dir=sealed_dir,
        # a launch whose checkpoint nothing reads keeps none: an A/A launch's last (protocol/plan.py)
        ckpt_dir=None if replay or not any(q.name == f"reload-{pkg.arm_label}" for q in ctx.plan) else ckpt_dir,
        script=p.launcher.script,
        args=substitute(_arm_args(ctx.loaded, arm_spec), values), inputs=inputs,
        steps=p.measurement.steps, warmup=p.measurement.warmup, window=p.measurement.window,
        digest_first=p.measurement.digest_first, digest_last=p.measurement.digest_last,
        host_controls=list(p.measurement.host_controls), watch_all=replay,
        watch_from=p.measurement.warmup if replay else 0,
        slurm=None if ctx.slurm is None else ctx.slurm.step(pkg.name, p.launcher.nproc, ctx.scratch),
    )


def _arm_args_config(loaded: LoadedProtocol, arm: str) -> list[str]:
    spec: Arm = getattr(loaded.protocol.arms, arm)
    return [x for key, value in sorted(spec.config.items()) for x in (f"--{key}", value)]


def _passing_checks(run_json: Path) -> tuple[EarlierRun, ChecksResult] | None:
    """An earlier run's record and its checks result, where its checks package passed."""
    run = EarlierRun.read(run_json)
    if run is None or not any(p.name == "checks" and p.status == "ok" for p in run.packages):
        return None
    try:
        return run, ChecksResult.model_validate_json((run_json.parent / "packages" / "checks" / "result.json")
                                                     .read_bytes())
    except (OSError, ValueError):
        return None


def diagnosed_in(ctx: RunContext) -> Diagnosed | None:
    """The calibration's first A/A launch, as the checks worker compares it (its versions): only where that run is
    of the same calibration, its checks package passed and ran every diagnostic of this protocol itself."""
    of = ctx.run_record.calibration_of if ctx.run_record is not None else None
    if of is None or of.diagnosed_by is None:
        return None
    found = _passing_checks(ctx.home.runs / of.diagnosed_by / "run.json")
    if found is None:
        return None
    run, done = found
    if run.protocol_id != ctx.loaded.id:
        return None
    checks = ctx.loaded.protocol.checks
    asked = [d.name for d in checks.diagnostics] + ([] if checks.static_graph is None else [checks.static_graph.name])
    if not asked or done.diagnosed_by is not None or [d.name for d in done.diagnostics] != asked or not all(
            d.ok for d in done.diagnostics):
        return None
    return Diagnosed(run_id=of.diagnosed_by, versions=dict(done.versions))


def last_passing_checks(runs_dir: Path, protocol_id: str, exclude: str) -> tuple[str, dict[str, str]] | None:
    """(run id, versions) of the latest earlier run of this protocol whose checks package passed."""
    best: tuple[str, str, dict[str, str]] | None = None
    for run_json in runs_dir.glob("*/run.json"):
        found = _passing_checks(run_json)
        if found is None:
            continue
        run, result = found
        if run.run_id is None or run.protocol_id != protocol_id or run.run_id == exclude:
            continue
        if best is None or run.started > best[0]:
            best = (run.started, run.run_id, dict(result.versions))
    return None if best is None else (best[1], best[2])


def _announce_version_changes(ctx: RunContext, result: Any, say: Callable[[str], None]) -> None:
    """The owner's rule: rerun the GPU diagnostics after upgrades; the checks always run, so say what changed."""
    if not isinstance(result, ChecksResult):
        return
    previous = last_passing_checks(ctx.home.runs, ctx.loaded.id, ctx.run_id)
    if previous is None:
        return
    changed = {k: (previous[1].get(k), v) for k, v in result.versions.items() if previous[1].get(k) != v}
    if changed:
        listed = "; ".join(f"{k}: {old} -> {new}" for k, (old, new) in sorted(changed.items()))
        # a later A/A launch back on the versions its calibration's first launch passed them under leaves them to it
        rerun = ("the GPU diagnostics were rerun by this run's checks package" if result.diagnosed_by is None else
                 f"the GPU diagnostics were not rerun: run {result.diagnosed_by} passed them under these versions")
        say(f"environment changed since the last passing checks of this protocol (run {previous[0]}): {listed}; "
            + rerun)
        ctx.update_run(versions_changed=VersionsChanged(since_run=previous[0], changes=changed))


def _peaks(result: Any) -> dict[str, int | None]:
    if not isinstance(result, TrainResult):
        return {"peak_allocated": None, "peak_reserved": None}
    alloc = [r.peak_allocated for r in result.ranks if r.peak_allocated is not None]
    res = [r.peak_reserved for r in result.ranks if r.peak_reserved is not None]
    return {"peak_allocated": max(alloc) if alloc else None, "peak_reserved": max(res) if res else None}


def run_plan(ctx: RunContext, progress: Progress) -> tuple[str, dict[str, str]]:
    """Run the plan; returns (run status, package -> status). Raises KeyboardInterrupt after recording it."""
    if ctx.caches is None:
        _open_caches(ctx, progress.say)
    assert ctx.caches is not None
    statuses = {pkg.name: "not-run" for pkg in ctx.plan}
    init_digest: str | None = None
    failed_at: int | None = None
    interrupted = False
    index = -1
    while index + 1 < len(ctx.plan):  # a sequential run's plan grows while it runs (after_triplet)
        index += 1
        pkg = ctx.plan[index]
        spec = package_spec(ctx, pkg, init_digest)
        arm_spec: Arm | None = getattr(ctx.loaded.protocol.arms, pkg.arm) if pkg.arm else None
        assert ctx.grant is not None
        values = _placeholders(ctx, pkg)
        launcher_env = {k: substitute([v], values)[0] for k, v in ctx.loaded.protocol.launcher.env.items()}
        env = package_env(os.environ, ctx.grant.env({}), launcher_env,
                          arm_spec.switches if arm_spec else {}, ctx.run_id)
        cache = ctx.caches.prepare(pkg.name, pkg.kind)  # orch owns every package's compile cache
        env.update(ctx.caches.env(cache))
        ctx.record(pkg, "open", started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        entry = PackageEntry(name=pkg.name, kind=pkg.kind, arm_label=pkg.arm_label, arm=pkg.arm,
                             env=env_summary(env), status="running")
        ctx.run_record = ctx.run.with_package(entry)
        ctx.write_run_json()
        m = ctx.loaded.protocol.measurement
        steps = m.primed_steps if pkg.kind == "prime" else m.steps if pkg.kind in ("train", "replay") else None
        progress.start(pkg.name, pkg.kind, steps)
        pkg_dir = Path(spec.package_dir)
        timeouts = ctx.loaded.protocol.timeouts
        timeout = float(timeouts.train * WATCH_TIMEOUT_FACTOR if pkg.kind == "replay"
                        else timeouts.train if pkg.kind == "prime" else getattr(timeouts, pkg.kind))

        def tick(elapsed: float, pkg_dir: Path = pkg_dir) -> None:
            progress.tick(elapsed, probe_progress(pkg_dir), ctx.gpus)

        prefix = ctx.slurm.prefix(pkg.kind, pkg.name) if ctx.slurm is not None else []
        refused = _slurm_precheck(ctx) if ctx.slurm is not None and index == 0 else None
        if refused is None:  # again just before it starts: nothing may have changed since the last package ended
            refused = _sealed_unchanged(ctx, cache, init_digest if pkg.kind != "score" else None)
        # the host watched through every train launch (issue 27): foreign CPU and GPU use, per window in the audit
        watcher = HostWatcher(pkg_dir, package_devices(spec.device, env)) if pkg.kind == "train" else None
        if watcher is not None:
            watcher.start()
        try:
            outcome: PackageOutcome = (run_package(spec, env, timeout, on_tick=tick, prefix=prefix, cache=str(cache),
                                                   endpoints=ctx.loaded.protocol.launcher.endpoints)
                                       if refused is None
                                       else PackageOutcome(pkg.name, "failed", None, 0.0, utc_now(), utc_now(),
                                                           note=refused))
        finally:
            watched = None if watcher is None else watcher.finish()
        if ctx.slurm is not None and outcome.status == "failed" and refused is None:  # a lost node, by hash
            outcome.note = ctx.slurm.explain_failure(outcome.note, pkg.kind)
        said: dict[str, Any] = {}  # what only some packages have to say
        keep_sealed: CacheUse | None = None
        # orch's own handling of what the package wrote comes first, every seal and cache check after it
        # (orchestrator/isolation/safe_paths.py: nothing the package could have planted is followed)
        _handle_outputs(ctx, pkg, pkg_dir, outcome, said)
        if outcome.status == "ok":
            try:
                _check_sealed(ctx, f"during {pkg.name}", init_digest if pkg.kind != "score" else None,
                              content=index == last_init_reader(ctx.plan))
                if ctx.loaded.protocol.measurement.compile == "none":  # checked after every package, never trusted
                    ctx.caches.check_compiled_nothing(pkg.name)
                if ctx.slurm is not None:  # after this package, so before the next: nothing runs in between
                    ctx.slurm.check_seals(_seal_roots(ctx), f"after {pkg.name}")
                ckpt = getattr(spec, "ckpt_dir", None)
                if pkg.kind == "train" and ckpt is not None:  # read-only, and checked from now on
                    ctx.checkpoints[pkg.arm_label or pkg.name] = seal_checkpoint(Path(ckpt))
                if ctx.sequential is not None and ctx.sequential.stop is None and ctx.plan[index + 1].kind == "replay":
                    after_triplet(ctx)  # the look after the last planned triplet: stop, or one triplet more
                    statuses.update({p.name: "not-run" for p in ctx.plan if p.name not in statuses})
            except FailedError as err:
                outcome.status, outcome.note = "failed", err.message
        if outcome.status == "ok" and pkg.kind == "prime":
            try:
                ran = outcome.result.steps if isinstance(outcome.result, TrainResult) else None
                sealed = ctx.caches.seal_baseline(ran, ctx.loaded.protocol.measurement.steps)
                said["compile_cache"] = sealed.model_dump()
                keep_sealed = sealed
                outcome.note = kept_cache.SEALED_NOTE.format(entries=sealed.sealed_entries, sha=sealed.manifest_sha256)
            except FailedError as err:
                outcome.status, outcome.note = "failed", err.message
        elif pkg.kind == "prime":
            ctx.caches.discard_prime()
        else:
            use = ctx.caches.use(pkg.name, pkg.kind)
            if use is not None:
                said["compile_cache"] = use.model_dump()
        ctx.caches.remove_work(pkg.name, pkg.kind)
        if watched is not None:
            said["host_watch"] = watched.model_dump()
        if outcome.extra.get("stragglers"):
            said["stragglers"] = outcome.extra["stragglers"]
        if outcome.status == "ok" and pkg.kind in ("train", "replay", "prime") and ctx.slurm is None:
            phases = startup_phases(outcome.extra.get("startup"), outcome.result)  # type: ignore[arg-type]
            if phases is not None:
                said["startup"] = phases
        if outcome.status == "ok" and pkg.kind == "reload":
            _drop_checkpoint(ctx, pkg)
        if outcome.status == "ok" and pkg.kind == "checks":
            init = ctx.scratch / "init.safetensors"
            init_digest = sha256_file(init) if init.is_file() else None
            ctx.init_stat = file_fingerprint(init)
            _announce_version_changes(ctx, outcome.result, progress.say)
            if isinstance(outcome.result, ChecksResult) and outcome.result.diagnosed_by is not None:
                outcome.note = (f"the diagnostics not run again: run {outcome.result.diagnosed_by} (this "
                                "calibration's first A/A launch) passed them under the same versions")
        result_digest = outcome.result_sha256
        if pkg.kind == "score" and outcome.status == "ok":
            result_digest = sha256_file(ctx.run_dir / "score.sealed.json")  # the ledger holds the sealed digest only
        gpu_seconds = round(outcome.wall_s * ctx.gpus, 6)
        if ctx.slurm is not None and refused is None:  # what Slurm charged its steps (sacct), ids in the note
            gpu_seconds, slurm_note = slurm_charge(ctx.slurm, pkg.name)
            outcome.note = f"{slurm_note}; {outcome.note}" if outcome.note else slurm_note
        if ctx.slurm is not None:  # srun's messages name nodes: evidence and the ledger name them by hash only
            outcome.note = None if outcome.note is None else ctx.slurm.scrub(outcome.note)
            ctx.slurm.scrub_logs(pkg_dir)
        ctx.record(pkg, outcome.status, started=outcome.started, ended=outcome.ended,
                   wall_s=round(outcome.wall_s, 6), gpu_seconds=gpu_seconds, result_digest=result_digest,
                   exit_code=outcome.exit_code, note=outcome.note, **_peaks(outcome.result))
        if pkg.kind == "prime" and outcome.status == "ok" and keep_sealed is not None:
            _keep_prime(ctx, keep_sealed, gpu_seconds, progress.say)
        ctx.run_record = ctx.run.with_package(entry.finish(
            **said, status=outcome.status, exit_code=outcome.exit_code, started=outcome.started, ended=outcome.ended,
            wall_s=round(outcome.wall_s, 6), gpus=ctx.gpus, gpu_seconds=gpu_seconds,
            result_sha256=outcome.result_sha256, note=outcome.note, isolation=outcome.extra.get("isolation"),
            network=outcome.extra.get("network")))
        ctx.write_run_json()
        statuses[pkg.name] = outcome.status
        progress.finish(pkg.name, outcome.status, outcome.wall_s, gpu_seconds, outcome.note)
        while ctx.sequential is not None and ctx.sequential.said:
            progress.say(ctx.sequential.said.pop(0))
        if outcome.status != "ok":
            failed_at = index
            interrupted = outcome.status == "interrupted"
            break
    if failed_at is not None:
        stopped = ctx.plan[failed_at].name
        for pkg in ctx.plan[failed_at + 1 :]:
            ctx.record(pkg, "not-run", note=f"not reached: {stopped} {statuses[stopped]}")
        if interrupted:
            return "interrupted", statuses
        return "failed", statuses
    return "complete", statuses


def _open_caches(ctx: RunContext, say: Callable[[str], None]) -> None:
    """The run's compile caches, under the key of what decides the baseline's kernels; a kept cache of that key whose
    every entry is as its sealing run recorded is loaded instead of priming (issue 51), else the reason is said."""
    p = ctx.loaded.protocol
    launcher_env = {k: substitute([v], _placeholders(ctx, ctx.plan[0]))[0] for k, v in p.launcher.env.items()}
    fields = kept_cache.key_fields(ctx.loaded, trainer_command(ctx.loaded, p.arms.baseline),
                                   ctx.arms["baseline"].sources_root, ctx.host)
    key = kept_cache.cache_key(fields)
    # only the protocol places them (an inherited TRITON_CACHE_DIR of orch's own shell does not)
    ctx.caches = RunCaches.for_run(launcher_env, ctx.scratch, ctx.run_dir, key, ctx.run_id,
                                   ctx.home.root / kept_cache.KEPT_DIR)
    ctx.kept_key, ctx.kept_fields = key, fields
    if p.measurement.compile != "prime":
        return
    rec, entries, reason, checked = kept_cache.find(ctx.caches.root, key, ctx.ledger)
    if rec is None or entries is None:
        ctx.kept_reason = reason
        say(f"compile cache: a fresh prime ({reason})")
        return
    manifest = (ctx.caches.root / f"{rec.name}{kept_cache.MANIFEST_SUFFIX}").read_bytes()
    ctx.caches.adopt(rec.name, entries, manifest)
    ctx.kept = rec
    ctx.update_run(compile_cache=rec.as_run_record(True, checked_s=round(checked, 3)))
    ctx.write_run_json()
    say(f"compile cache: kept cache {rec.name} (sealed by run {rec.sealed_by} at {rec.sealed_at}) loaded: "
        f"{len(entries)} entries checked against its manifest in {checked:.1f} s; no prime")


def _keep_prime(ctx: RunContext, sealed: CacheUse, gpu_seconds: float, say: Callable[[str], None]) -> None:
    """The prime passed and its cache is sealed: keep it, for later runs and A/A launches of the same key."""
    caches = ctx.caches
    assert caches is not None and caches.manifest is not None and sealed.manifest_sha256 is not None
    rec = kept_cache.KeptRecord(
        key=ctx.kept_key, fields=ctx.kept_fields, name=caches.baseline.name, sealed_by=ctx.run_id,
        sealed_at=utc_now(), manifest_sha256=sealed.manifest_sha256, entries=sealed.sealed_entries or 0,
        files=sealed.baseline_files, tuned=sealed.baseline_tuned, tuned_sha256=sealed.baseline_tuned_sha256,
        prime_steps=sealed.prime_steps, launch_steps=sealed.launch_steps, prime_gpu_seconds=gpu_seconds)
    kept_cache.keep(caches.root, caches.manifest, rec)
    ctx.update_run(compile_cache=rec.as_run_record(False, reason=ctx.kept_reason))
    say(f"compile cache: kept as {rec.name} ({rec.entries} entries, prime of {rec.prime_steps} step(s)); later runs "
        "of this key load it")


def _handle_outputs(ctx: RunContext, pkg: PlannedPackage, pkg_dir: Path, outcome: PackageOutcome,
                    said: dict[str, Any]) -> None:
    """Blinding (the trainer's own outputs never stay in the run folder), then the run folder holds nothing but
    files and folders: a link, FIFO, socket or device there fails the package, named (orch and the audit read it)."""
    try:
        if pkg.kind in ("train", "replay", "prime"):
            moved = quarantine(pkg_dir, ctx.scratch, pkg.name)
            said["trainer_outputs"] = {**seal_outputs(ctx.scratch, pkg.name), "moved_from_run_dir": len(moved)}
        special = special_entries(pkg_dir)
    except (UnsafeEntry, OSError) as err:
        fail_outcome(outcome, f"its folders cannot be handled safely: {err}; orch follows no link a package made")
        return
    if special:
        shown = ", ".join(special[:5]) + (f" and {len(special) - 5} more" if len(special) > 5 else "")
        fail_outcome(outcome, f"left {len(special)} entr{'y' if len(special) == 1 else 'ies'} in its run folder that "
                              f"{'is' if len(special) == 1 else 'are'} not a file or a folder: {shown}; a package "
                              "may leave only files there")


def last_init_reader(plan: Sequence[PlannedPackage]) -> int:
    """The index of the last package that reads the shared initial state (every one but the scorer): after it the
    initial state's content is hashed as well. A sequential plan grows only before its watched replay, so the index
    found at any package is where the plan ends."""
    return max(i for i, p in enumerate(plan) if p.kind != "score")


def _check_sealed(ctx: RunContext, when: str, init_digest: str | None, content: bool = False) -> None:
    """Every arm's sealed copy, the sealed baseline compile cache, every kept checkpoint and the shared initial
    state are as sealed: FailedError naming what changed. The initial state by its fingerprint before and after every
    package, as checkpoints are (a write, even of the same bytes, a chmod or a replacement changes it: ctime cannot
    be set back), and with `content` by its SHA256 too: after the last package that reads it (last_init_reader), so
    bytes changed under an unchanged fingerprint still fail the run. Hashing it after every package cost about 2 s a
    package for r3-mini's 3.5 GB at the GPU-bound size, and a 7B model's weights take 10-20 s each time."""
    for arm in ctx.sealed:  # every arm: a candidate's package could edit the baseline's copy
        check_seal(ctx.sealed[arm])
    assert ctx.caches is not None
    ctx.caches.check_baseline(when)  # nor may it edit the compile cache every arm loads
    for label, sealed in ctx.checkpoints.items():
        changed = fingerprint_changes(sealed, stat_fingerprint(ctx.scratch / "ckpt" / label))
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise FailedError(f"the checkpoint of {label} changed {when}: {shown}; it is sealed once its train "
                              "package passed, and its reload and the scorer read it")
    if init_digest is None:
        return
    init = ctx.scratch / "init.safetensors"
    if file_fingerprint(init) != ctx.init_stat:
        raise FailedError(f"the shared initial state changed {when}")
    if content and sha256_file(init) != init_digest:
        raise FailedError(f"the shared initial state changed during the run: its SHA256, hashed {when} (the last "
                          "package that reads it), is not the one recorded after the checks (its file fingerprint did "
                          "not change)")


def _sealed_unchanged(ctx: RunContext, cache: Path, init_digest: str | None) -> str | None:
    """Before a package starts: None, or why it must not (what changed since the last package ended, and its own
    fresh compile-cache copy against the seal)."""
    try:
        _check_sealed(ctx, "between packages", init_digest)
        assert ctx.caches is not None
        ctx.caches.check_copy(cache)
    except FailedError as err:
        return err.message
    except (UnsafeEntry, OSError) as err:
        return f"the sealed inputs cannot be read safely before it started: {err}"
    return None


def _slurm_precheck(ctx: RunContext) -> str | None:
    """Every node reads the sealed copies before the first package: None, or why not (the first package fails)."""
    assert ctx.slurm is not None
    try:
        ctx.slurm.check_seals(_seal_roots(ctx), "before the first package")
    except FailedError as err:
        return err.message
    return None


def _seal_roots(ctx: RunContext) -> dict[str, tuple[Path, str]]:
    return {name: (sealed.path, sealed.manifest.root) for name, sealed in ctx.sealed.items()}


def slurm_charge(run: slurm.SlurmRun, package: str) -> tuple[float, str]:
    """(GPU-seconds sacct charged the package's steps, the ledger note naming the job and steps)."""
    from orchestrator.slurm.accounting import package_steps, step_note

    steps = package_steps(run.alloc.job_id, run.step_name(package))
    return round(sum(s.gpu_seconds for s in steps), 6), step_note(run.alloc.job_id, steps)


def _drop_checkpoint(ctx: RunContext, pkg: PlannedPackage) -> None:
    """With repeats, a launch's checkpoint is deleted once its reload passed, unless the scorer needs it."""
    repeats, sequential = ctx.shape
    if (repeats == 1 and not sequential) or pkg.arm_label is None or pkg.arm_label in kept_checkpoints(*ctx.shape):
        return
    ckpt = ctx.scratch / "ckpt" / pkg.arm_label
    ctx.checkpoints.pop(pkg.arm_label, None)
    if ckpt.exists():
        unseal_for_removal(ckpt)
        shutil.rmtree(ckpt, ignore_errors=True)
