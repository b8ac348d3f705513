"""orchestrator/isolation/process_group.py on real processes and signals: a group is waited for, ended, and dies
with us."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.isolation.process_group import exit_status, signal_group, spawn_in_group, terminate_group, wait_group

REPO = Path(__file__).resolve().parents[2]


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_exit_status_is_the_code_or_128_plus_the_signal() -> None:
    assert [exit_status(rc) for rc in (0, 3, -9, -15)] == [0, 3, 137, 143]


def test_waiting_for_the_leader_kills_what_it_left_in_its_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    proc = spawn_in_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 3"])
    assert wait_group(proc, timeout=30) == 3
    assert _gone(int(pidfile.read_text()))
    assert signal_group(proc, signal.SIGTERM) is False  # reaped: its pid may belong to someone else now


def test_a_wait_that_times_out_signals_nothing_and_terminate_escalates_to_sigkill() -> None:
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
           "time.sleep(60)"
    proc = spawn_in_group([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    with pytest.raises(subprocess.TimeoutExpired):
        wait_group(proc, timeout=0.2)
    assert proc.poll() is None
    t0 = time.monotonic()
    assert terminate_group(proc, grace_s=0.5) == -signal.SIGKILL  # SIGTERM ignored: killed after the grace
    assert time.monotonic() - t0 < 10
    proc.stdout.close()


def test_the_group_dies_with_the_process_that_spawned_it(tmp_path: Path) -> None:
    parent = (
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from orchestrator.isolation.process_group import spawn_in_group\n"
        "spawn_in_group(['sh', '-c', 'sleep 60 & echo grandchild $!; wait'])\n"
        # spawn_in_group has returned: the watchdog is running. One write() of the whole line, atomic on a pipe: an
        # unbuffered print (PYTHONUNBUFFERED) writes 'spawned' and its newline apart, and the shell's line can fall
        # between them
        "os.write(1, b'spawned\\n')\n"
        "time.sleep(60)\n"
    )
    errors = tmp_path / "parent.stderr"  # what the parent or its shell said, should a line be missing
    with errors.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        assert proc.stdout is not None
        lines = sorted([proc.stdout.readline(), proc.stdout.readline()])  # the two writers race
        said = f"parent exit {proc.poll()}, stdout {lines}, stderr {errors.read_text()[-2000:]!r}"
        assert lines[1] == "spawned\n" and len(lines[0].split()) == 2 and lines[0].split()[0] == "grandchild", said
        grandchild = int(lines[0].split()[1])
        assert psutil.pid_exists(grandchild)
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup runs in the parent: only PDEATHSIG and the watchdog
        proc.wait(timeout=10)
        assert _gone(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()


def test_the_group_dies_with_a_process_killed_right_after_the_leader_started(tmp_path: Path) -> None:
    """Killed after the leader started but before spawn_in_group returned (held there by a slowed Popen, as a loaded
    host can): the watchdog already runs, so what the leader started dies too (it outlived a kill -9 of gpu-run
    when the watchdog was spawned after the leader)."""
    parent = (
        "import os, subprocess, sys, time\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from orchestrator.isolation.process_group import spawn_in_group\n"
        "real = subprocess.Popen\n"
        "class Slowed(real):\n"
        "    def __init__(self, args, *a, **k):\n"
        "        super().__init__(args, *a, **k)\n"
        "        if args[0] == 'sh':\n"
        "            os.write(1, b'leader started\\n')\n"
        "            time.sleep(60)\n"
        "subprocess.Popen = Slowed\n"
        "spawn_in_group(['sh', '-c', 'sleep 60 & echo grandchild $!; wait'])\n"
    )
    errors = tmp_path / "parent.stderr"
    with errors.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, stderr=sink, text=True)
    try:
        assert proc.stdout is not None
        lines = sorted([proc.stdout.readline(), proc.stdout.readline()])
        said = f"parent exit {proc.poll()}, stdout {lines}, stderr {errors.read_text()[-2000:]!r}"
        assert lines[1] == "leader started\n" and lines[0].split()[0] == "grandchild", said
        grandchild = int(lines[0].split()[1])
        assert psutil.pid_exists(grandchild)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone(grandchild)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdout is not None:
            proc.stdout.close()


def test_on_exit_sees_what_the_leader_left_before_the_group_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    seen: list[bool] = []
    proc = spawn_in_group(["sh", "-c", f"sleep 60 & echo $! > {pidfile}; exit 0"])
    assert wait_group(proc, timeout=30, on_exit=lambda p: seen.append(psutil.pid_exists(int(pidfile.read_text())))) == 0
    assert seen == [True]  # named while alive, then ended with the group
    assert _gone(int(pidfile.read_text()))


def test_a_child_joins_the_cgroup_before_it_runs(tmp_path: Path) -> None:
    from orchestrator.isolation.cgroups import PackageCgroup, joiner
    from orchestrator.isolation.package_isolation import cgroups_work

    if not cgroups_work():
        pytest.skip("no cgroup v2 with cgroup.kill writable here")
    group = PackageCgroup.make(f"orch-test-{os.getpid()}")
    assert group is not None
    fd = joiner(group.procs_file())
    try:
        # the leader waits until its child is in its new session (the inner shell writes its pid after setsid):
        # else wait_group's end of the leader's process group could take the child before it left the group
        ready = tmp_path / "ready"
        proc = spawn_in_group(["sh", "-c", f"setsid sh -c 'echo $$ > {ready}; exec sleep 60' </dev/null >/dev/null "
                                           f"2>&1 & while [ ! -s {ready} ]; do sleep 0.05; done; exit 0"],
                              cgroup_fd=fd)
    finally:
        os.close(fd)
    wait_group(proc, timeout=30)
    deadline = time.monotonic() + 10  # under load the inner shell may still be exec-ing sleep
    left = group.members()
    while [name for _, name in left] != ["sleep"] and time.monotonic() < deadline:
        time.sleep(0.1)
        left = group.members()
    assert [name for _, name in left] == ["sleep"]  # a new session does not leave the cgroup
    group.kill_and_remove()
    assert _gone(left[0][0]) and not group.path.exists()
