"""Faults, for real: kill -9 of orch at five points, of a rank and of the scorer; SIGINT, SIGINT inherited as
ignored, SIGTERM; a full disk; the lock held by another process; a second launch beside a live run.

Survived = no process of the run left, the lock free, the ledger verifying (naming an orphan where orch died),
nothing half-written, the documented exit code; the next launch reports dead runs and removes their scratch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from common import (
    Check,
    Launch,
    Row,
    Work,
    checks_only,
    cli,
    closes,
    lines,
    lock_free,
    make_project,
    no_process_left,
    orch_argv,
    records,
    run_processes,
    wait_for,
)

ORCH_KILL_POINTS = [("checks", 0), ("train-A", 2), ("reload-A", 0), ("watch-C", 2), ("score", 0)]


class FaultHome:
    """One home shared by the faults, as a user's home is: each launch meets what the previous fault left."""

    def __init__(self, work: Work) -> None:
        self.base = work.fresh("faults")
        self.proj = make_project(self.base)
        self.home = self.base / "home"
        self.locks = self.base / "locks"
        self.protocol = self.proj / "protocol" / "small.yaml"
        self.n = 0

    def launch(self, protocol: Path | None = None, **kw: object) -> Launch:
        self.n += 1
        return Launch(self.proj, protocol or self.protocol, self.home, f"launch{self.n}", lock_dir=self.locks,
                      **kw)  # type: ignore[arg-type]

    def verify(self) -> subprocess.CompletedProcess[str]:
        return cli(orch_argv("ledger", "verify", "--home", str(self.home)), cwd=self.proj, timeout=120)


def _after_death(fh: FaultHome, c: Check, run_id: str, package: str) -> None:
    """What must hold after orch itself died by SIGKILL while `package` ran."""
    c.that(no_process_left(run_id), "no process of the run within 10 s")
    c.that(lock_free(fh.locks), "lock free")
    shown = fh.verify()
    orphan = f"orphaned: run {run_id} package {package}"
    c.that(shown.returncode == 0, f"ledger verifies (exit {shown.returncode})")
    c.that(orphan in shown.stdout + shown.stderr, "ledger verify names the orphan")
    c.that(not (fh.home / "runs" / run_id / "audit.json").exists(), "no audit")


def kill_orch(fh: FaultHome, package: str, steps: int) -> Row:
    row = Row("fault", f"kill -9 of orch during {package}",
              "no worker left, lock free, ledger verifies and names the orphan, no audit")
    launch = fh.launch()
    launch.wait_package(package, timeout=900, steps=steps)
    if steps == 0:
        time.sleep(1.0)  # the package's worker is running
    run_id = launch.run_id()
    alive = len(run_processes(run_id))
    launch.proc.send_signal(signal.SIGKILL)
    launch.proc.wait()
    c = Check()
    c.saw(f"killed with {alive} run processes alive")
    _after_death(fh, c, run_id, package)
    row.ok, row.observed = not c.failed, c.observed()
    return row


def _kill_child(run_id: str, match: str, rank: str | None = None) -> str:
    for p in run_processes(run_id):
        try:
            cmd = " ".join(p.cmdline())
            if match in cmd and (rank is None or p.environ().get("RANK") == rank):
                p.send_signal(signal.SIGKILL)
                return f"pid of {match}{'' if rank is None else ' rank ' + rank}"
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return "none found"


def kill_rank(fh: FaultHome) -> Row:
    row = Row("fault", "kill -9 of a rank (train-A, rank 1)",
              "train-A failed naming the signal, later packages not-run, nothing left, lock free, exit 1")
    launch = fh.launch()
    launch.wait_package("train-A", steps=2)
    run_id = launch.run_id()
    what = _kill_child(run_id, "workers.probe", rank="1")
    rc = launch.wait()
    note = " ".join(str(r["note"]) for r in records(fh.home) if r["run_id"] == run_id and r["package"] == "train-A")
    status = closes(fh.home, run_id)
    c = Check()
    c.saw(f"killed {what}; exit {rc}; train-A {status.get('train-A')}: {note.strip()}")
    c.that(rc == 1, "exit 1")
    c.that(status.get("train-A") == "failed", "train-A failed")
    c.that("SIGKILL" in note or "signal 9" in note, "the note names the signal")
    c.that(status.get("score") == "not-run", "later packages not-run")
    c.that(no_process_left(run_id), "no process left")
    c.that(lock_free(fh.locks), "lock free")
    row.ok, row.observed = not c.failed, c.observed()
    return row


def kill_scorer(fh: FaultHome) -> Row:
    row = Row("fault", "kill -9 of the scorer", "score failed, no audit and no score shown, nothing left, exit 1")
    launch = fh.launch()
    launch.wait_package("score", timeout=900)
    run_id = launch.run_id()
    what = "none found"
    deadline = time.monotonic() + 60
    while what == "none found" and time.monotonic() < deadline and launch.proc.poll() is None:
        what = _kill_child(run_id, "score.py")  # the scorer the score worker runs
        time.sleep(0.05)
    rc = launch.wait()
    status = closes(fh.home, run_id)
    c = Check()
    c.saw(f"killed {what}; exit {rc}; score {status.get('score')}")
    c.that(what != "none found", "the scorer was found and killed")
    c.that(rc == 1, "exit 1")
    c.that(status.get("score") == "failed", "score failed")
    c.that(not (fh.home / "runs" / run_id / "audit.json").exists(), "no audit")
    c.that("dev_mean_reward" not in launch.stdout + launch.stderr, "no score shown")
    c.that(no_process_left(run_id), "no process left")
    c.that(lock_free(fh.locks), "lock free")
    row.ok, row.observed = not c.failed, c.observed()
    return row


def interrupt(fh: FaultHome, sig: signal.Signals, ignore_sigint: bool, package: str) -> Row:
    how = f"{sig.name}{' inherited as ignored' if ignore_sigint else ''}"
    row = Row("fault", f"{how} during {package}",
              f"exit 130, {package} interrupted, the rest not-run, nothing left, lock free, scratch removed")
    launch = fh.launch(ignore_sigint=ignore_sigint)
    launch.wait_package(package, steps=2 if package.startswith("train") else 0)
    run_id = launch.run_id()
    launch.proc.send_signal(sig)
    try:
        rc = launch.wait(timeout=60)
    except subprocess.TimeoutExpired:
        launch.stop()
        rc = -999
    status = closes(fh.home, run_id)
    run_json = fh.home / "runs" / run_id / "run.json"
    c = Check()
    c.saw(f"exit {rc}; {package} {status.get(package)}")
    c.that(rc == 130, "exit 130")
    c.that(status.get(package) == "interrupted", f"{package} interrupted")
    c.that(status.get("score") == "not-run", "later packages not-run")
    c.that(run_json.exists() and json.loads(run_json.read_text()).get("status") == "interrupted", "run interrupted")
    c.that(no_process_left(run_id), "no process left")
    c.that(lock_free(fh.locks), "lock free")
    c.that(not (fh.home / "scratch" / run_id).exists(), "scratch removed")
    row.ok, row.observed = not c.failed, c.observed()
    return row


@contextlib.contextmanager
def _tmpfs(path: Path) -> Iterator[bool]:
    path.mkdir(parents=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True, check=False
    ).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def full_disk(work: Work) -> Row:
    row = Row("fault", "home on a full disk (2 MiB tmpfs, filled)",
              "one line, exit 1, no traceback, nothing half-written, ledger verifies")
    base = work.fresh("disk")
    proj = make_project(base)
    protocol = checks_only(proj, "fail.yaml", ["python", "-c", "raise SystemExit(3)"])
    c = Check()
    with _tmpfs(base / "disk") as mounted:
        if not mounted:
            row.observed = "not run: mounting a tmpfs needs root"
            return row
        home = base / "disk" / "home"
        for d in ("runs", "ledger", "scratch"):
            (home / d).mkdir(parents=True)
        st = os.statvfs(base / "disk")
        with (base / "disk" / "filler").open("wb") as f:
            f.write(b"\0" * (st.f_bavail * st.f_frsize))
        done = cli(orch_argv("launch", str(protocol), "--home", str(home), "--lock-dir", str(base / "locks")),
                   cwd=proj, timeout=120)
        out = lines(done.stdout + done.stderr)
        c.saw(f"exit {done.returncode}: {out[-1] if out else ''}")
        c.that(done.returncode == 1, "exit 1")
        c.that(len(out) == 1, f"one line (got {len(out)})")
        c.that("Traceback" not in done.stderr, "no traceback")
        c.that(not any((home / "runs").iterdir()), "no run folder")
        c.that(not [p for p in home.rglob("*") if ".tmp" in p.name], "no temporary file left")
        verified = cli(orch_argv("ledger", "verify", "--home", str(home)), cwd=proj, timeout=60)
        c.that(verified.returncode in (0, 1) and "Traceback" not in verified.stderr, "ledger readable")
    row.ok, row.observed = not c.failed, work.scrub(c.observed())
    return row


def foreign_lock(fh: FaultHome) -> Row:
    row = Row("fault", "lock held by another process (util-linux flock on a slot)",
              "orch waits, gives up with exit 75 naming the holder, never signals it, runs no package")
    fh.locks.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(["flock", str(fh.locks / "slot0.lock"), "sleep", "300"], start_new_session=True)
    try:
        wait_for(lambda: not lock_free(fh.locks, 1), 10, "the foreign holder to take the lock")
        launch = fh.launch(args=["--lock-timeout", "3"])
        rc = launch.wait(timeout=120)
        run_id = launch.run_id()
        status = closes(fh.home, run_id)
        err = lines(launch.stderr)
        c = Check()
        c.saw(f"exit {rc}: {err[-1] if err else ''}")
        c.that(rc == 75, "exit 75")
        c.that(holder.poll() is None, "the holder is alive")
        c.that(str(holder.pid) in launch.stderr or "flock" in launch.stderr, "names the holder")
        c.that(set(status.values()) <= {"not-run"}, "no package ran")
    finally:
        os.killpg(holder.pid, signal.SIGTERM)  # flock and its sleep (which inherited the locked descriptor)
        holder.wait()
        wait_for(lambda: lock_free(fh.locks, 1), 10, "the foreign holder to let go")
    row.ok, row.observed = not c.failed, c.observed()
    return row


def live_beside(fh: FaultHome) -> Row:
    row = Row("fault", "kill -9 of a run, then launches beside a live run",
              "the next launch removes the dead run's scratch; launches beside and waiting for the live run name "
              "the dead run only after the lock, never the live one, whose scratch stays")
    four = {"GPU_RUN_SLOTS": "4"}
    wait = checks_only(fh.proj, "wait.yaml", ["python", "-c", "import time; time.sleep(600)"])
    fail = checks_only(fh.proj, "fail.yaml", ["python", "-c", "raise SystemExit(3)"])
    c = Check()
    c.that(lock_free(fh.locks, 4), "every slot free before")
    dead = fh.launch(wait, extra_env=four)
    dead_id = dead.run_id()
    wait_for(lambda: dead.started_package("checks"), 120, "the dead run's checks")
    dead.proc.send_signal(signal.SIGKILL)
    dead.proc.wait()
    c.that((fh.home / "scratch" / dead_id).is_dir(), "the killed run left its scratch")
    live = fh.launch(wait, extra_env=four)
    try:
        live_id = live.run_id()
        wait_for(lambda: live.started_package("checks"), 120, "the live run's checks")
        c.that(not (fh.home / "scratch" / dead_id).exists(), "the next launch removed the dead run's scratch")
        beside = fh.launch(fail, extra_env=four)
        rc = beside.wait(timeout=180)
        orphaned = [ln for ln in beside.stderr.splitlines() if ln.startswith("orphaned")]
        c.saw(f"beside: exit {rc}, {len(orphaned)} orphan lines")
        c.that(rc == 1, "the failing launch exits 1")
        c.that(any(dead_id in ln for ln in orphaned), "the dead run named as orphaned")
        c.that(not any(live_id in ln for ln in orphaned), "live run not called crashed")
        c.that((fh.home / "scratch" / live_id).is_dir(), "live run's scratch kept")
        # the reviewer's case: a launch waiting for the live run's slots called it "a crash or kill -9"
        waiter = fh.launch(fail, extra_env={"GPU_RUN_SLOTS": "2"})
        wait_for(lambda: "waiting for" in waiter.stderr, 120, "the waiting launch to wait for the lock")
        said_while_waiting = [ln for ln in waiter.stderr.splitlines() if ln.startswith("orphaned")]
        live.proc.send_signal(signal.SIGTERM)
        c.that(live.wait(timeout=60) == 130, "the live run stops with 130 on SIGTERM")
        c.that(waiter.wait(timeout=180) == 1, "the waiter runs once the lock is free (its checks fail: exit 1)")
        said = [ln for ln in waiter.stderr.splitlines() if ln.startswith("orphaned")]
        c.saw(f"waiter: {len(said_while_waiting)} orphan lines while waiting, none naming the live run: "
              f"{not any(live_id in ln for ln in said)}")
        c.that(not said_while_waiting, "nothing reported while waiting")
        c.that(not any(live_id in ln for ln in said), "the waiter never calls the live run crashed")
    finally:
        live.stop()
    row.ok, row.observed = not c.failed, c.observed()
    return row


def faults(work: Work) -> list[Row]:
    fh = FaultHome(work)
    rows = [kill_orch(fh, package, steps) for package, steps in ORCH_KILL_POINTS]
    rows += [
        kill_rank(fh),
        kill_scorer(fh),
        interrupt(fh, signal.SIGINT, False, "train-A"),
        interrupt(fh, signal.SIGINT, True, "checks"),
        interrupt(fh, signal.SIGTERM, False, "train-C"),
        full_disk(work),
        foreign_lock(fh),
        live_beside(fh),
    ]
    for r in rows:
        r.observed = work.scrub(r.observed)
    return rows
