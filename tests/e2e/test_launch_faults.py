"""`orch launch` under faults, for real: SIGINT inherited as ignored, a damaged ledger, a full disk, a kill -9,
a second launch waiting for the first one's lock. The protocols run no trainer (a checks package that waits
or fails), so each launch costs seconds, not a training run."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from launchutil import edit_protocol, env, launch_cmd, lock_is_free, make_project, records, wait_for
from ledgerutil import offsets

from ledger.cost.store import Ledger

pytestmark = pytest.mark.slow


def _checks(data: dict[str, Any], command: list[str]) -> None:
    data["checks"] = {"prepare": [{"name": "step", "command": command}], "diagnostics": [], "static_graph": None}


def waiting(proj: Path, seconds: float) -> Path:
    return edit_protocol(proj, lambda d: _checks(d, ["python", "-c", f"import time; time.sleep({seconds})"]),
                         name=f"wait{seconds:g}.yaml")


def failing(proj: Path) -> Path:
    return edit_protocol(proj, lambda d: _checks(d, ["python", "-c", "raise SystemExit(3)"]), name="fail.yaml")


class Launch:
    """One `orch launch` in the background, its stdout and stderr in files (readable while it runs)."""

    def __init__(self, proj: Path, protocol: Path, home: Path, tag: str, extra_env: dict[str, str] | None = None,
                 ignore_sigint: bool = False) -> None:
        self.out, self.err = home.parent / f"{tag}.out", home.parent / f"{tag}.err"
        home.parent.mkdir(parents=True, exist_ok=True)

        def pre() -> None:
            if ignore_sigint:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script starts

        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(launch_cmd(proj, protocol, home), cwd=proj, env={**env(), **(extra_env or {})},
                                         stdout=out, stderr=err, text=True, preexec_fn=pre)

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    def run_id(self) -> str:
        wait_for(lambda: any(line.startswith("run ") for line in self.stderr.splitlines()), 60, "the run id")
        return next(line.split()[1] for line in self.stderr.splitlines() if line.startswith("run "))

    def wait(self, timeout: float = 120) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def launches() -> Iterator[list[Launch]]:
    started: list[Launch] = []
    try:
        yield started
    finally:
        for launch in started:
            launch.stop()


def _open(home: Path, run_id: str, package: str) -> bool:
    """The package's open record is in the ledger (polled while orch writes it: a file orch has just created may not
    hold its schema yet, which is 'not yet', never a failure of the test)."""
    try:
        return (home / "ledger" / "ledger.arrows").exists() and any(
            r["run_id"] == run_id and r["package"] == package and r["status"] == "open" for r in records(home))
    except pa.ArrowInvalid:
        return False


def test_sigint_inherited_as_ignored_is_handled_like_sigterm(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    with launches() as started:
        run = Launch(proj, waiting(proj, 120), home, "a", ignore_sigint=True)
        started.append(run)
        run_id = run.run_id()
        wait_for(lambda: _open(home, run_id, "checks"), 60, "the checks package to start")
        run.proc.send_signal(signal.SIGINT)
        assert run.wait(timeout=40) == 130, run.stderr
    closes = {r["package"]: r["status"] for r in records(home) if r["run_id"] == run_id and r["status"] != "open"}
    assert closes["checks"] == "interrupted" and set(closes.values()) == {"interrupted", "not-run"}
    assert lock_is_free(tmp_path / "locks") and not (home / "scratch" / run_id).exists()


@pytest.mark.parametrize("damage", ["flipped byte", "truncated at a record boundary"])
def test_launch_refuses_a_ledger_that_fails_verify_before_the_lock(tmp_path: Path, damage: str) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    ledger = Ledger(home / "ledger" / "ledger.arrows")
    for i in range(4):
        ledger.append(run_id="old", package=f"p{i}", kind="checks", status="not-run", protocol_id="p")
    data = bytearray(ledger.path.read_bytes())
    if damage == "flipped byte":
        data[len(data) // 2] ^= 0x20
    else:
        data = data[: offsets(ledger.path)[3]]  # one whole record gone: what is left still chains
    ledger.path.write_bytes(bytes(data))
    before = ledger.path.read_bytes()
    proc = subprocess.run(launch_cmd(proj, failing(proj), home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "ledger does not verify" in proc.stderr
    assert ledger.path.read_bytes() == before  # nothing appended
    assert not any((home / "runs").iterdir()) and not (tmp_path / "locks").exists()  # no run, no lock asked


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[str]:
    """A real full disk: a 2 MiB tmpfs mounted at `path` (root); else a file-size limit (EFBIG) is the fault."""
    path.mkdir(parents=True)
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True, check=False
    ).returncode == 0
    try:
        yield "tmpfs" if mounted else "rlimit"
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(path: Path, leave: int) -> None:
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    with (path / "filler").open("wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.mark.parametrize("free_kib", [0, 64])
def test_full_disk_is_one_line_and_leaves_nothing_half_written(tmp_path: Path, free_kib: int) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "disk" / "home"
    protocol = failing(proj)
    with small_disk(tmp_path / "disk") as how:
        for d in ("runs", "ledger", "scratch"):
            (home / d).mkdir(parents=True)
        (home / "ledger" / "host.salt").write_text("ab" * 32 + "\n")
        limit = None
        if how == "tmpfs":
            _fill(tmp_path / "disk", free_kib * 1024)
        else:
            limit = free_kib * 1024 // 16  # no file may grow past this: writes fail with EFBIG

        def pre() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        proc = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                              timeout=120, preexec_fn=pre)
        assert proc.returncode == 1, proc.stderr
        assert "Traceback" not in proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith("orch: ") and ("No space left on device" in last or "File too large" in last), last
        if free_kib == 0:
            assert len(proc.stderr.strip().splitlines()) == 1
        # nothing half-written: every run folder complete, every JSON document whole, no temporary file left
        for run_dir in (home / "runs").iterdir():
            assert not run_dir.name.startswith("."), run_dir.name
            for name in ("protocol.json", "run.json"):
                json.loads((run_dir / name).read_text())
        leftovers = [p for p in home.rglob("*") if ".tmp" in p.name]
        assert leftovers == []
        assert Ledger(home / "ledger" / "ledger.arrows").verify().ok
        if free_kib == 0:
            assert not any((home / "runs").iterdir())


def test_second_launch_reports_dead_runs_only_after_the_lock_and_removes_only_their_scratch(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    four = {"GPU_RUN_SLOTS": "4"}
    with launches() as started:
        dead = Launch(proj, waiting(proj, 120), home, "dead", four)
        started.append(dead)
        dead_id = dead.run_id()
        wait_for(lambda: _open(home, dead_id, "checks"), 60, "the first run's checks")
        dead.proc.send_signal(signal.SIGKILL)
        dead.wait()
        assert (home / "scratch" / dead_id).is_dir()
        live = Launch(proj, waiting(proj, 120), home, "live", four)  # slots 0-1
        started.append(live)
        live_id = live.run_id()
        wait_for(lambda: _open(home, live_id, "checks"), 60, "the live run's checks")
        assert f"removed scratch/{dead_id} of dead run {dead_id}" in live.stderr  # the next launch tidies
        assert not (home / "scratch" / dead_id).exists()
        # a launch beside the live run (slots 2-3): the dead run is named and its scratch removed; the live one's
        beside = Launch(proj, failing(proj), home, "beside", four)
        started.append(beside)
        assert beside.wait() == 1, beside.stderr
        orphaned = [line for line in beside.stderr.splitlines() if line.startswith("orphaned")]
        assert orphaned == [f"orphaned: run {dead_id} package checks has an open ledger record and no close "
                            "(a crash or kill -9)"], beside.stderr
        assert (home / "scratch" / live_id).is_dir()  # a live run's scratch is never removed
        # a launch that must wait for the live run's slots says nothing about it while it waits, nor after
        waiter = Launch(proj, failing(proj), home, "waiter", {"GPU_RUN_SLOTS": "2"})
        started.append(waiter)
        wait_for(lambda: "waiting for" in waiter.stderr, 60, "the second launch to wait for the lock")
        assert "orphaned" not in waiter.stderr
        live.proc.send_signal(signal.SIGTERM)
        assert live.wait() == 130
        assert waiter.wait() == 1, waiter.stderr
        assert live_id not in "\n".join(ln for ln in waiter.stderr.splitlines() if ln.startswith("orphaned"))
        assert not (home / "scratch" / live_id).exists()
