"""What Slurm charged: each package's steps from `sacct` (AllocTRES gres/gpu x ElapsedRaw), and
`orch ledger reconcile`, which compares the ledger's Slurm records with sacct for the same jobs and steps.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from ledger.cost.store import Ledger
from orchestrator.slurm.cluster import STEP_NOTE, gres_gpus
from protocol.errors import FailedError
from protocol.home import resolve_home

FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED")
SACCT_FIELDS = "JobID,JobName%200,AllocTRES%200,ElapsedRaw,State"


@dataclass(frozen=True)
class StepUse:
    """One Slurm step as sacct accounts it."""

    job_id: str
    step: str  # the step number within the job
    name: str
    gpus: int  # AllocTRES gres/gpu of the step (all its nodes)
    elapsed_s: int  # ElapsedRaw
    state: str

    @property
    def gpu_seconds(self) -> float:
        return float(self.gpus * self.elapsed_s)

    @property
    def final(self) -> bool:
        return self.state.split()[0] in FINAL_STATES


def parse_sacct(text: str) -> tuple[dict[str, StepUse], StepUse | None]:
    """(numbered steps by step id, the job's own line) from `sacct -n -P -o SACCT_FIELDS` output."""
    steps: dict[str, StepUse] = {}
    job: StepUse | None = None
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        jobid, name, tres, elapsed, state = parts[:5]
        job_id, _, step = jobid.partition(".")
        use = StepUse(job_id, step, name, gres_gpus(tres), int(elapsed) if elapsed.isdigit() else 0, state)
        if not step:
            job = use
        elif step.isdigit():  # batch, extern and interactive steps are Slurm's own
            steps[step] = use
    return steps, job


def sacct_job(job_id: str) -> tuple[dict[str, StepUse], StepUse | None]:
    try:
        done = subprocess.run(["sacct", "-j", job_id, "-n", "-P", "-o", SACCT_FIELDS], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise FailedError(f"sacct did not answer ({err}); is Slurm accounting (slurmdbd) running?") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        raise FailedError(f"sacct -j {job_id} failed: {last[:200]}; is Slurm accounting (slurmdbd) running?")
    return parse_sacct(done.stdout)


def package_steps(job_id: str, step_name: str, timeout_s: float = 30.0, none_s: float = 5.0) -> list[StepUse]:
    """The steps named `step_name` once sacct has their end (accounting reaches slurmdbd shortly after); [] when
    none appears within `none_s` (a package that failed before its srun)."""
    t0 = time.monotonic()
    while True:
        steps, _ = sacct_job(job_id)
        mine = sorted((s for s in steps.values() if s.name == step_name), key=lambda s: int(s.step))
        waited = time.monotonic() - t0
        if (mine and all(s.final for s in mine)) or waited > timeout_s or (not mine and waited > none_s):
            return mine
        time.sleep(0.5)


def step_note(job_id: str, steps: list[StepUse]) -> str:
    """The ledger note of a Slurm package (first, so that a failure note after it never cuts it)."""
    if not steps:
        return f"slurm job {job_id}: no step of this package reached sacct"
    ids = ",".join(s.step for s in steps)
    gpus = max((s.gpus for s in steps), default=0)
    elapsed = sum(s.elapsed_s for s in steps)
    return f"slurm job {job_id} steps {ids}: {gpus} gres/gpu x {elapsed} s"


def reconcile(home_dir: Path | None) -> dict[str, Any]:
    """Every ledger record of a Slurm package against sacct: its steps exist and their gres/gpu x ElapsedRaw is the
    record's gpu_seconds. FailedError (exit 1) naming each mismatch."""
    home = resolve_home(home_dir)
    ledger = Ledger(home.ledger_path)
    if not ledger.path.exists():
        raise FailedError(f"no ledger at {ledger.path}: nothing has been recorded there; check --home or $ORCH_HOME")
    jobs: dict[str, tuple[dict[str, StepUse], StepUse | None]] = {}
    rows: list[dict[str, Any]] = []
    mismatches: list[str] = []
    for rec in ledger.records():
        m = STEP_NOTE.match(rec.note or "")
        if m is None or rec.status in ("open", "not-run"):
            continue
        job_id, ids = m.group(1), m.group(2).split(",")
        if job_id not in jobs:
            jobs[job_id] = sacct_job(job_id)
        steps, _ = jobs[job_id]
        found = [steps[i] for i in ids if i in steps]
        missing = [i for i in ids if i not in steps]
        charged = sum(s.gpu_seconds for s in found)
        who = f"run {rec.run_id} package {rec.package} (job {job_id} steps {','.join(ids)})"
        if missing:
            mismatches.append(f"{who}: sacct has no step {','.join(missing)}")
        elif rec.gpu_seconds is None or abs(charged - rec.gpu_seconds) > 1e-6:
            mismatches.append(f"{who}: ledger {rec.gpu_seconds} GPU-s, sacct {charged:g} GPU-s")
        rows.append({"run_id": rec.run_id, "package": rec.package, "job": job_id, "steps": ids,
                     "ledger_gpu_seconds": rec.gpu_seconds, "sacct_gpu_seconds": charged,
                     "states": [s.state for s in found]})
    totals = []
    for job_id, (_, job) in sorted(jobs.items()):
        in_ledger = sum(r["ledger_gpu_seconds"] or 0.0 for r in rows if r["job"] == job_id)
        if job is not None:
            totals.append({"job": job_id, "allocation_gpu_seconds": job.gpu_seconds, "packages_gpu_seconds": in_ledger})
            typer.echo(f"job {job_id}: the allocation was charged {job.gpu_seconds:g} GPU-s "
                       f"({job.gpus} gres/gpu x {job.elapsed_s} s); its packages' steps {in_ledger:g} GPU-s")
    for problem in mismatches:
        typer.echo(f"mismatch: {problem}")
    doc = {"records": len(rows), "jobs": totals, "mismatches": mismatches, "rows": rows}
    if mismatches:
        raise FailedError(f"{len(mismatches)} ledger record(s) differ from sacct: {mismatches[0]}", document=doc)
    typer.echo(f"ok: {len(rows)} Slurm package record(s) match sacct ({len(jobs)} job(s))")
    return doc
