"""The train package: the arm's unmodified trainer under torchrun, the probe injected into every rank.

Usage: python -m workers.train --spec package.json  (cwd = the arm's sealed copy) -> result.json (orch.train/1)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from pydantic import ValidationError

from protocol.fileio import read_regular, regular_sha256
from protocol.host.clock import (
    STEP_ABS_TOL_S,
    STEP_REL_TOL,
    WINDOW_ABS_TOL_S,
    WINDOW_REL_TOL,
    ClockCheck,
    compare,
    independent_bounds,
    independent_durations,
)
from protocol.package import PackageSpec
from protocol.process import die_with_parent, process_started
from protocol.results import ObservedRecipe, ProbeSummary, RankSummary, StepRecord, TrainResult
from workers.clock import StepClock
from workers.common import WorkerFailed, run_entry_point
from workers.quiet_host import HostWatch
from workers.rank.rank_end import kill_and_wait
from workers.rank_failure import RANK_FAILED_LINE, failure_cause, killed_rank, signal_name, wait_or_hung
from workers.torchrun import torchrun_command


def _traceback_tail(log: Path, limit: int = 40) -> str:
    """Only the last traceback of the trainer's log: its other lines may hold sealed evaluation values."""
    try:
        return _tail_of(log.read_text(errors="replace"), limit)
    except OSError:
        return ""


def _tail_of(text: str, limit: int = 40) -> str:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if "Traceback (most recent call last)" in line]
    picked = lines[starts[-1] :][-limit:] if starts else [ln for ln in lines if ln.startswith("probe:")][-5:]
    return "\n".join(picked)


def _read_rank(spec: PackageSpec, rank: int) -> tuple[ProbeSummary, list[StepRecord]]:
    pkg = Path(spec.package_dir)
    summary_path = pkg / f"probe.rank{rank}.json"
    if not os.path.lexists(summary_path):
        raise WorkerFailed(f"rank {rank} wrote no probe summary ({summary_path.name})")
    try:
        raw = read_regular(summary_path)
    except OSError as err:
        raise WorkerFailed(f"rank {rank}: {summary_path.name}: {err.strerror}") from None
    try:
        summary = ProbeSummary.model_validate_json(raw)
    except ValidationError as err:
        why = err.errors()[0]["msg"]
        raise WorkerFailed(f"rank {rank}: malformed probe summary {summary_path.name} ({why})") from err
    if not summary.complete:
        raise WorkerFailed(f"rank {rank} stopped after {summary.steps} of {spec.steps} steps")
    try:  # what the trainer's process could replace: a link or FIFO is refused, never followed or waited on
        lines = read_regular(pkg / f"steps.rank{rank}.jsonl").decode().splitlines()
    except OSError as err:
        raise WorkerFailed(f"rank {rank}: steps.rank{rank}.jsonl: {err.strerror}") from None
    records = [StepRecord.model_validate_json(line) for line in lines]
    # a prime that stops when compiling stops (issue 51) ran from 2 steps to all of them
    n = summary.steps if getattr(spec, "until_compiled", False) and 2 <= summary.steps <= spec.steps else spec.steps
    if [r.step for r in records] != list(range(n)) or any(r.rank != rank for r in records):
        raise WorkerFailed(f"rank {rank}: step lines are not steps 0..{n - 1} of this rank")
    return summary, records


def collect(spec: PackageSpec, stopped_cleanly: bool, clock: StepClock | None = None) -> TrainResult:
    """Reads every rank's probe output and checks it before it becomes the package's result."""
    ranks: list[RankSummary] = []
    ran: set[int] = set()
    recipes: list[ObservedRecipe | None] = []
    watched: list[list[int]] = []
    for rank in range(spec.nproc):
        summary, records = _read_rank(spec, rank)
        checked = None if clock is None else check_clock(spec, rank, summary, records, clock)
        recipes.append(summary.observed_recipe)
        ran.add(len(records))
        watched.append(summary.watched_steps)
        ckpt_file: str | None = None
        if spec.ckpt_dir is not None:
            ckpt = Path(str(spec.ckpt_dir)) / str(summary.checkpoint_file)
            try:
                same = regular_sha256(ckpt) == summary.checkpoint_sha256
            except OSError as err:  # missing, or a link / FIFO / device the trainer left in its place
                raise WorkerFailed(f"rank {rank}: checkpoint {ckpt.name} cannot be read as a file: {err}") from None
            if not same:
                raise WorkerFailed(f"rank {rank}: checkpoint {ckpt.name} differs from its digest")
            ckpt_file = os.path.relpath(ckpt, spec.scratch_dir)
        steps_path = Path(spec.package_dir) / summary.steps_file
        ranks.append(
            RankSummary(
                rank=rank,
                steps_file=steps_path.name,
                steps_sha256=regular_sha256(steps_path),
                steps=len(records),
                final_combined=str(summary.final_combined),
                final_digests=summary.final_digests,
                peak_allocated=summary.peak_allocated,
                peak_reserved=summary.peak_reserved,
                checkpoint_file=ckpt_file,
                checkpoint_sha256=None if ckpt_file is None else summary.checkpoint_sha256,
                host_controls=summary.host_controls,
                clock=checked,
                startup=summary.startup,
            )
        )
    if any(r != recipes[0] for r in recipes):
        raise WorkerFailed("ranks observed different recipes (optimizer settings or frozen parameters)")
    recipe = recipes[0]
    if recipe is None:
        raise WorkerFailed("the probe observed no optimizer step")
    if any(w != watched[0] for w in watched):
        raise WorkerFailed("ranks watched different steps for forbidden dtypes")
    if len(ran) != 1:
        raise WorkerFailed(f"ranks stopped after different step counts {sorted(ran)}")
    return TrainResult(
        arm=str(spec.arm_label or spec.name),  # the prime package has no launch label
        world_size=spec.nproc,
        steps=ran.pop(),
        digest_steps=list(range(spec.digest_first, spec.digest_last + 1)),
        device=spec.device,
        observed_recipe=recipe,
        ranks=ranks,
        stopped_cleanly=stopped_cleanly,
        watched_steps=watched[0],
    )


def check_clock(
    spec: PackageSpec, rank: int, summary: ProbeSummary, records: list[StepRecord], clock: StepClock
) -> ClockCheck:
    """Refuse step times the trainer could have faked: a replaced clock function, or durations that disagree
    with the kernel's stamps of the probe's clock lines beyond the tolerance (protocol.host.clock)."""
    replaced = summary.clock_replaced
    if replaced:
        names = ", ".join(f"time.{n} (from step {s})" for n, s in sorted(replaced.items()))
        raise WorkerFailed(
            f"clock disagreement: rank {rank}: the trainer replaced {names}; step times must come from a clock "
            "the trainer does not touch: refused"
        )
    if clock.malformed or clock.unstamped:
        raise WorkerFailed(f"clock disagreement: {clock.malformed} malformed and {clock.unstamped} unstamped clock "
                           "line(s) reached the train worker: refused")
    try:
        independent = independent_durations(clock.arrivals[rank])
        bounds = independent_bounds(clock.arrivals[rank])
    except ValueError as exc:
        raise WorkerFailed(f"clock disagreement: rank {rank}: {exc}: refused") from exc
    probe = {r.step: r.duration_s for r in records}
    windows = [list(range(w, w + spec.window)) for w in range(spec.warmup, spec.steps, spec.window)]
    cmp = compare(rank, probe, independent, windows, bounds=bounds)
    if cmp.bad:
        more = f" and {len(cmp.bad) - 1} more" if len(cmp.bad) > 1 else ""
        raise WorkerFailed(f"{cmp.bad[0].line()}{more}: refused")
    name = f"clock.rank{rank}.jsonl"
    path = Path(spec.package_dir) / name
    clock.write_arrivals(path, rank)
    return ClockCheck(
        source="socket", steps_checked=len(probe), windows_checked=len(windows), max_step_abs_s=cmp.max_step_abs,
        max_step_rel=cmp.max_step_rel, max_window_abs_s=cmp.max_window_abs, max_window_rel=cmp.max_window_rel,
        step_tol=(STEP_ABS_TOL_S, STEP_REL_TOL), window_tol=(WINDOW_ABS_TOL_S, WINDOW_REL_TOL), arrivals_file=name,
        arrivals_sha256=regular_sha256(path),
    )


def node_cause(spec: PackageSpec) -> str | None:
    """The cause of a multi-node failure, named by node index: a rank killed by a signal on some node (the others
    then lose their peer, and srun's kill-on-bad-exit may end a node's agent before it reports), else a node that
    never reported (it died, or its agent was killed), else the rank that raised first on any node, else the first
    node whose torchrun failed."""
    from workers.node import failed_nodes, silent_nodes

    found = []
    for node, rc, text in failed_nodes(spec):
        cause = failure_cause(text)
        # 0: a rank killed by a signal nobody in the chain sends; 1: torchrun itself killed so; 2: a rank that raised
        # or exited; 3: torchrun ended by SIGTERM, which srun sends every node once another node's task failed: a
        # consequence, never the cause, whichever node's report arrives first
        order = 0 if killed_rank(text) else 2
        if rc < 0 and order:  # a rank's kill it logged before srun ended it stays the cause
            cause = f"torchrun was killed by signal {-rc} ({signal_name(-rc)})"
            order = 3 if -rc == signal.SIGTERM else 1
        raised = [float(m.group(2)) for m in map(RANK_FAILED_LINE.match, text.splitlines()) if m]
        found.append((order, min(raised, default=float("inf")), node, cause or f"torchrun exited with {rc}", text))
    silent = silent_nodes(spec)
    if silent and not any(f[0] <= 1 for f in found):  # the others' errors (peer lost) follow from it
        return f"node {silent[0]}: no report from it (its node agent was killed, or the node died)"
    if not found:
        return None
    *_, node, cause, text = min(found, key=lambda f: f[:3])
    sys.stderr.write(f"node {node}'s last traceback:\n{_tail_of(text)}\n")
    return f"node {node}: {cause}"


def slurm_command(spec: PackageSpec) -> list[str]:
    """srun of the node agent: one task a node, each node's torchrun joining one c10d rendezvous."""
    assert spec.slurm is not None
    spec_path = Path(spec.package_dir) / "package.json"
    return [*spec.slurm.srun, sys.executable, "-m", "workers.node", "train", "--spec", str(spec_path)]


def run(spec: PackageSpec) -> TrainResult:
    log = Path(spec.scratch_dir) / f"{spec.name}.trainer.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    Path(spec.package_dir).mkdir(parents=True, exist_ok=True)
    # under Slurm every node runs its own clock (workers.node): the ranks of other hosts cannot reach this one
    clock = StepClock(spec.nproc) if spec.slurm is None else None
    if clock is not None:
        clock.start()
    watch = HostWatch()
    watch.start()
    startup = {"worker": process_started() or time.time(), "torchrun": time.time()}
    try:
        with log.open("wb") as out:  # the trainer's own output stays in scratch: it may log sealed evaluations
            proc = subprocess.Popen(
                torchrun_command(spec, clock.name) if clock is not None else slurm_command(spec), cwd=spec.sealed_dir,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=die_with_parent(signal.SIGTERM),  # SIGTERM when this worker dies
            )  # fmt: skip
            try:
                rc, hung = wait_or_hung(proc, log)
            except BaseException:
                proc.terminate()
                proc.wait(timeout=30)
                raise
    finally:
        if clock is not None:
            clock.stop()
    quiet = watch.finish()
    leftovers = psutil.Process().children(recursive=True)
    kill_and_wait(leftovers, timeout_s=10)
    if rc != 0:
        sys.stderr.write(f"the trainer's last traceback:\n{_traceback_tail(log)}\n")
        cause = failure_cause(log.read_text(errors="replace"))
        if hung is not None:  # the ranks would have waited until the package's timeout: ended at once
            where = Path(*Path(spec.package_dir).parts[-4:]) / "stderr.log"  # under the home: no private path
            cause = (f"the trainer hung after `{hung}` (a socket under its TMPDIR, {len(os.environ.get('TMPDIR', ''))} "
                     f"characters, passes the 107-character AF_UNIX limit: set a shorter ORCH_HOME or TMPDIR); "
                     f"its last traceback: {where}")
        if spec.slurm is not None:  # each node's torchrun wrote its own log
            cause = node_cause(spec) or cause
        # one last line: the package's failure note in the ledger
        raise WorkerFailed(f"torchrun exited with {rc}" + (f": {cause}" if cause else ""))
    if clock is None:
        from workers.node import load_clock

        clock = load_clock(spec)
    result = collect(spec, stopped_cleanly=not leftovers, clock=clock)
    result = result.model_copy(update={"quiet_host": quiet, "startup": startup})
    if leftovers:
        raise WorkerFailed(f"{len(leftovers)} process(es) outlived the trainer's stop; they were killed")
    return result


def main(argv: list[str] | None = None) -> int:
    spec, _ = run_entry_point("train", run, argv)
    print(f"train {spec.arm_label}: {spec.nproc} ranks x {spec.steps} steps, result {spec.result_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
