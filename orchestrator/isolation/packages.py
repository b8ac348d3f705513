"""Running one sealed package: `python -m workers.<kind> --spec package.json` in its own process group.

Allow-listed environment, cwd in the sealed copy, a timeout, logs to files, one strictly validated result.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ValidationError

import orchestrator.isolation.interrupts as interrupts
from orchestrator.isolation.package_isolation import PackageIsolation, fresh_folders, isolate
from orchestrator.isolation.process_group import exit_status, spawn_in_group, terminate_group, wait_group
from orchestrator.isolation.stragglers import TOKEN_VAR, end_stragglers, new_token
from orchestrator.isolation.surface import surface_dirs
from protocol.fileio import read_regular, write_atomic
from protocol.hashing import canonical_json
from protocol.package import PackageSpec, TrainSpec
from protocol.results import ChecksResult, ReloadResult, ScoreResult, TrainResult
from protocol.schema import endpoint
from protocol.trainer_path import TRAINER_PATH_VAR

ORCH_ROOT = Path(__file__).resolve().parents[2]  # holds workers/, protocol/: first on PYTHONPATH of every package
RESULT_MODELS: dict[str, type[BaseModel]] = {
    "checks": ChecksResult,
    "train": TrainResult,
    "replay": TrainResult,
    "prime": TrainResult,
    "reload": ReloadResult,
    "score": ScoreResult,
}
# What a package may inherit from orch's environment; everything else is left behind.
ENV_ALLOW = (
    "PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "HOME", "USER", "LOGNAME", "LD_LIBRARY_PATH", "CUDA_HOME",
    "NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "GLOO_SOCKET_IFNAME", "TRITON_CACHE_DIR",
    "SLURM_CONF",  # a cluster whose slurm.conf is not in the default place (srun, scontrol of a Slurm run)
)
# Never let a package turn NVLink multicast on (a shared host's GPUs can go out of service).
ENV_FIXED = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "PYTHONUNBUFFERED": "1",
    # Triton's own autotuner keeps its picks in TRITON_CACHE_DIR, so that the prime's pick is every arm's pick
    "TRITON_CACHE_AUTOTUNING": "1",
}
GRANT_KEYS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GPU_RUN_KIND", "GPU_RUN_DEVICES", "GPU_RUN_SLOTS_GRANTED")
GRACE_S = 10.0


@dataclass
class PackageOutcome:
    name: str
    status: str  # ok | failed | timeout | interrupted
    exit_code: int | None
    wall_s: float
    started: str
    ended: str
    result: BaseModel | None = None
    result_sha256: str | None = None
    note: str | None = None
    extra: dict[str, object] = field(default_factory=dict)


def package_env(
    base: Mapping[str, str], grant_env: Mapping[str, str], launcher_env: Mapping[str, str],
    switches: Mapping[str, str], run_id: str,
) -> dict[str, str]:
    env = {k: base[k] for k in ENV_ALLOW if k in base}
    for key in GRANT_KEYS:
        if key in grant_env:
            env[key] = grant_env[key]
    env.update(launcher_env)
    env.update(switches)
    env.update(ENV_FIXED)
    # orch's workers start from orch alone: its root and what orch itself runs with (made absolute here, so that
    # nothing resolves against the sealed cwd), and no interpreter of the package puts its cwd or script folder first
    # (PYTHONSAFEPATH, as -P; inherited by torchrun and every rank). The protocol's own entries (e.g. "." for a
    # trainer that imports its top-level packages from its root) reach the trainer only: the probe adds them once
    # its own modules are imported, and restores PYTHONPATH for what the trainer starts (workers/trainer_path.py)
    inherited = [os.path.abspath(p) for p in base.get("PYTHONPATH", "").split(os.pathsep) if p]
    declared = [p for p in launcher_env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(ORCH_ROOT), *inherited]))
    env[TRAINER_PATH_VAR] = os.pathsep.join([str(ORCH_ROOT), *declared, *inherited])
    env["PYTHONSAFEPATH"] = "1"
    # `python` in a protocol command is the interpreter that runs orch (its venv), whatever PATH says first
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), *path])
    env["ORCH_RUN_ID"] = run_id
    return env


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_spec(spec: PackageSpec) -> Path:
    pkg_dir = Path(spec.package_dir)
    pkg_dir.mkdir(parents=True, exist_ok=True)
    path = pkg_dir / "package.json"
    # a local train package's document has no slurm key at all
    local = isinstance(spec, TrainSpec) and spec.slurm is None
    doc = spec.model_dump(mode="json", by_alias=True, exclude={"slurm"} if local else None)
    text = canonical_json(doc, ensure_ascii=True, pretty=True)
    write_atomic(path, text.encode())
    path.chmod(0o444)
    return path


def load_result(kind: str, path: Path) -> tuple[BaseModel | None, str | None, str | None]:
    """(result, sha256, problem): a missing or malformed result is a failure with a one-line reason."""
    try:
        raw = read_regular(path)
    except FileNotFoundError:
        return None, None, f"no result document at {path.name}"
    except OSError as err:  # a link, FIFO or device where the result should be: never followed or waited on
        return None, None, f"no result document at {path.name}: {err.strerror}"
    try:
        result = RESULT_MODELS[kind].model_validate_json(raw)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        return None, None, f"malformed {path.name}: {loc}: {first['msg']}"
    return result, hashlib.sha256(raw).hexdigest(), None


def run_package(
    spec: PackageSpec, env: Mapping[str, str], timeout_s: float, on_tick: Callable[[float], None] | None = None,
    isolation: str = "auto", prefix: Sequence[str] = (), surface: Sequence[str] | None = None,
    cache: str | None = None, shared: Sequence[str] | None = None, endpoints: Sequence[str] = (),
) -> PackageOutcome:
    """Run the package to its end (or timeout / Ctrl-C), isolated (orchestrator.isolation.package_isolation), end what
    it left running, validate its result. It may write only its own folders (package directory, private TMPDIR and HOME,
    `cache`: its compile cache folder (orchestrator/isolation/compile_cache.py); checks and score: the run directory and
    scratch). A process left running after its main process, a change of the interpreter's startup surface (scan mode)
    or a write outside fails it, named. `prefix`: what the worker runs under (srun on a Slurm allocation's first node);
    `surface`: the startup folders scan mode compares (default: the interpreter's and the package's PYTHONPATH);
    `shared`: the shared folders scan mode lists (default: the host's; tests name a private one); `endpoints`: the TCP
    services (launcher.endpoints, HOST:PORT) it may reach from its own network namespace."""
    token = new_token()
    try:
        outcome = _run_package(spec, {**env, TOKEN_VAR: token}, timeout_s, on_tick, isolation, prefix, surface,
                               cache, shared, endpoints)
    finally:
        left = end_stragglers(token)
    if left:
        outcome.extra["stragglers"] = left
        fail_outcome(outcome, f"left {len(left)} process(es) running outside its group, ended by orch: "
                              f"{', '.join(left)}")
    return outcome


def fail_outcome(outcome: PackageOutcome, note: str) -> None:
    """Fail an outcome (an ok one; a failed one keeps its status) with `note` first."""
    outcome.status = "failed" if outcome.status == "ok" else outcome.status
    outcome.note = f"{note}; {outcome.note}" if outcome.note else note


def own_folders(spec: PackageSpec) -> list[str]:
    """The folders (and files) a package may write, made before it starts. Train, replay and reload: their
    package directory, trainer folder, clock folder and trainer log, and a train package its checkpoint folder;
    checks and score read and write the whole run (the first makes the shared inputs, the last reads every arm's
    checkpoint)."""
    pkg_dir = Path(spec.package_dir)
    run_dir, scratch = pkg_dir.parent.parent, Path(spec.scratch_dir)
    if spec.kind in ("checks", "score"):
        return [str(run_dir), str(scratch)]
    folders = [pkg_dir, scratch / "trainer" / spec.name]
    ckpt = getattr(spec, "ckpt_dir", None)
    if ckpt and spec.kind != "reload":  # a reload reads its arm's sealed checkpoint; only the train writes it
        folders.append(Path(ckpt))
    slurm = getattr(spec, "slurm", None)
    if slurm is not None:
        folders.append(Path(slurm.clock_dir))
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    log = scratch / f"{spec.name}.trainer.log"  # workers/train.py writes the trainer's own output there
    # made here, never through a link an earlier package planted at its name (O_NOFOLLOW: ELOOP names it)
    os.close(os.open(log, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644))
    return [*map(str, folders), str(log)]


def _run_package(
    spec: PackageSpec, env: Mapping[str, str], timeout_s: float, on_tick: Callable[[float], None] | None,
    isolation: str, prefix: Sequence[str] = (), surface: Sequence[str] | None = None, cache: str | None = None,
    shared: Sequence[str] | None = None, endpoints: Sequence[str] = (),
) -> PackageOutcome:
    isolating = time.time()  # start-up figures (orchestrator.run.startup): the package's set-up begins
    spec_path = write_spec(spec)
    pkg_dir = Path(spec.package_dir)
    run_dir = pkg_dir.parent.parent  # runs/<id>/packages/<name>
    planted = fresh_folders(spec.scratch_dir, spec.name, trainer=spec.kind not in ("checks", "score"))
    if planted:  # never reused: what an earlier package left there would be this one's TMPDIR, HOME or outputs
        return PackageOutcome(spec.name, "failed", None, 0.0, utc_now(), utc_now(), extra={"planted": planted},
                              note=f"its private folders existed before it started: {', '.join(planted)} (orch "
                                   "makes them anew for every package; an earlier package may have planted them)")
    iso = isolate(spec.scratch_dir, spec.name, [*own_folders(spec), *([cache] if cache else [])], isolation,
                  protect=[str(run_dir.parent.parent)], shared=shared,
                  # srun needs slurmctld and munge: a Slurm package keeps the host's network (its ranks do anyway)
                  network="host" if prefix or getattr(spec, "slurm", None) is not None else "own",
                  endpoints=[endpoint(e) for e in endpoints],
                  surface=surface_dirs(env, skip=[spec.scratch_dir]) if surface is None else surface)
    iso.start()
    worker = [sys.executable, "-P", "-m", f"workers.{spec.kind}", "--spec", str(spec_path)]
    cmd = iso.command([*prefix, *worker], spec.sealed_dir)
    env = iso.env(env)
    started, t0, spawned = utc_now(), time.monotonic(), time.time()
    try:
        outcome = _run(spec, cmd, env, timeout_s, on_tick, started, t0, iso)
    finally:
        iso.finish()
    outcome.extra["startup"] = {"isolate": isolating, "spawn": spawned}
    # run.json's isolation says which guarantee held: namespace (read-only root, PID namespace) or scan+ENDING
    outcome.extra["isolation"] = iso.mode if iso.mode == "namespace" else f"scan+{iso.ending}"
    outcome.extra["ending"] = iso.ending
    outcome.extra["network"] = iso.network  # namespace, or host (scan mode, srun, or the kernel refused one: why)
    if iso.survivors:
        outcome.extra["survivors"] = iso.survivors
        fail_outcome(outcome, f"left {len(iso.survivors)} process(es) running after its main process ended, ended "
                              f"by orch ({iso.ending}): {', '.join(iso.survivors)}; a package's processes must end "
                              "with it")
    outside = iso.written_outside(env.get(TOKEN_VAR))
    if outside:
        shown = ", ".join(outside[:5]) + (f" and {len(outside) - 5} more" if len(outside) > 5 else "")
        outcome.extra["written_outside"] = outside  # all of them (run.json); the note shows the first five
        fail_outcome(outcome, f"new entries outside the run directory and scratch while it ran: {shown} (scan mode "
                              "cannot tell which process made an entry: these are this user's, still there a moment "
                              "later and held open by no process outside the package; a package may write only its "
                              "own folders, its TMPDIR and HOME are private)")
    changed = iso.surface_changed()
    if changed:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        outcome.extra["surface_changed"] = changed
        fail_outcome(outcome, f"changed the interpreter's startup surface: {shown}; later packages would load it: "
                              "remove it before the next run")
    return outcome


def _run(
    spec: PackageSpec, cmd: list[str], env: Mapping[str, str], timeout_s: float,
    on_tick: Callable[[float], None] | None, started: str, t0: float, iso: PackageIsolation,
) -> PackageOutcome:
    pkg_dir = Path(spec.package_dir)
    with open(pkg_dir / "stdout.log", "wb") as out, open(pkg_dir / "stderr.log", "wb") as err:
        try:
            with interrupts.deferred():  # an interrupt now is raised by check() below, where the group is ended
                proc = spawn_in_group(cmd, env=env, cwd=spec.sealed_dir, stdout=out, stderr=err,
                                      stdin=subprocess.DEVNULL, **iso.spawn_args())
        finally:
            iso.spawned()
        try:
            while True:
                interrupts.check()  # one deferred above, or lost in an at-fork hook
                try:
                    rc = wait_group(proc, timeout=0.5, on_exit=iso.leader_exited)
                    break
                except subprocess.TimeoutExpired:
                    elapsed = time.monotonic() - t0
                    if on_tick is not None:
                        on_tick(elapsed)
                    if elapsed > timeout_s:
                        rc = terminate_group(proc, GRACE_S)
                        return PackageOutcome(spec.name, "timeout", exit_status(rc), time.monotonic() - t0,
                                              started, utc_now(), note=f"exceeded its timeout of {timeout_s:.0f} s")
        except BaseException:  # Ctrl-C, SIGTERM or an error here: the package must not outlive orch's decision
            rc = terminate_group(proc, GRACE_S)
            return PackageOutcome(spec.name, "interrupted", exit_status(rc), time.monotonic() - t0, started, utc_now(),
                                  note="interrupted")
    wall = time.monotonic() - t0
    code = exit_status(rc)
    result, digest, problem = load_result(spec.kind, Path(spec.result_path))
    if code != 0:
        tail = _last_line(pkg_dir / "stderr.log")
        return PackageOutcome(spec.name, "failed", code, wall, started, utc_now(), result_sha256=digest,
                              note=f"exit {code}" + (f": {tail}" if tail else ""))
    if problem is not None:
        return PackageOutcome(spec.name, "failed", code, wall, started, utc_now(), note=problem)
    return PackageOutcome(spec.name, "ok", code, wall, started, utc_now(), result=result, result_sha256=digest)


def _last_line(path: Path) -> str:
    try:
        lines = [ln for ln in read_regular(path).decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    return lines[-1].strip()[:300] if lines else ""


def probe_progress(pkg_dir: Path) -> int:
    """Steps completed so far by rank 0 of a train package (lines of its probe file)."""
    path = pkg_dir / "steps.rank0.jsonl"
    try:  # a link or FIFO the package put there is never followed or waited on
        return read_regular(path).count(b"\n")
    except OSError:
        return 0


def env_summary(env: Mapping[str, str]) -> dict[str, str]:
    """The environment as recorded in evidence: values of machine-specific paths are not kept."""
    hidden = {"PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_HOME", "TMPDIR", "PYTHONPATH", "USER", "LOGNAME", "SLURM_CONF"}
    return {k: ("<set>" if k in hidden else v) for k, v in sorted(env.items())}


