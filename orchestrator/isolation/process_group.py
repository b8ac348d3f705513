"""Process groups: spawn a child as the leader of its own group that dies with this process; signal, wait, end it.

The child gets PR_SET_PDEATHSIG (protocol/process.py) and, with a watchdog, its whole group is SIGKILLed too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

from protocol.process import die_with_parent

# The watchdog reads the leader's pid (its group id), which the leader writes itself before it runs its command, then
# waits: end of file (this process died) kills the group; b'x' stands it down. A leader that never wrote its pid (it
# failed first) leaves nothing to kill.
_WATCHDOG_CODE = (
    "import os,signal\n"
    "signal.signal(signal.SIGINT,signal.SIG_IGN)\n"
    "f=os.fdopen(0,'rb',0)\n"
    "pid=f.readline()\n"
    "if pid.strip().isdigit() and f.read(1)!=b'x':\n"
    "    try: os.killpg(int(pid),signal.SIGKILL)\n"
    "    except OSError: pass\n"
)
# leader pid -> (leader, write end of its watchdog's pipe, watchdog)
_WATCHDOGS: dict[int, tuple[subprocess.Popen[bytes], int, subprocess.Popen[bytes]]] = {}


def spawn_in_group(
    cmd: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    *,
    stdin: int | IO[Any] | None = None,
    watchdog: bool = True,
    pass_fds: Sequence[int] = (),
    cgroup_fd: int | None = None,
) -> subprocess.Popen[bytes]:
    """Start `cmd` as the leader of a new session/process group that dies with this process.

    The child gets PR_SET_PDEATHSIG=SIGKILL; with `watchdog`, a tiny helper also SIGKILLs the whole group
    when this process dies (PDEATHSIG reaches only the direct child). Spawn from a long-lived thread:
    PDEATHSIG fires when the spawning *thread* exits. End it with wait_group() or terminate_group(): they
    stand the watchdog down before the leader's pid can be reused (a leader reaped another way, e.g. by
    proc.wait(), is stood down at the next spawn and at exit). `cgroup_fd`: an open cgroup.procs file the child
    joins before it runs anything (orchestrator.isolation.cgroups); `pass_fds`: descriptors the child inherits.
    """
    _sweep()
    arm = die_with_parent(signal.SIGKILL)
    # The watchdog starts first and the leader tells it its pid before it runs its command: were this process killed
    # between the two spawns the other way round, what the leader had already started would outlive it (PDEATHSIG
    # ends the leader only). Seen: a kill -9 of gpu-run just after its command started left the command's child.
    guard: subprocess.Popen[bytes] | None = None
    write_fd = -1
    if watchdog:
        read_fd, write_fd = os.pipe()  # non-inheritable: the watchdog gets the read end as stdin, the leader's
        try:                        # fork keeps the write end only until its exec
            guard = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _WATCHDOG_CODE],
                stdin=read_fd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except BaseException:
            os.close(write_fd)
            raise
        finally:
            os.close(read_fd)

    def preexec() -> None:
        arm()
        if write_fd >= 0:
            os.write(write_fd, b"%d\n" % os.getpid())  # after setsid: the group's id
        if cgroup_fd is not None:
            os.write(cgroup_fd, b"0")
    try:
        proc = subprocess.Popen(
            list(cmd),
            env=None if env is None else dict(env),
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
            preexec_fn=preexec,
            pass_fds=tuple(pass_fds),
        )
    except BaseException:
        if guard is not None:  # no leader runs
            _stand_down(write_fd, guard)
        raise
    if guard is not None:
        _WATCHDOGS[proc.pid] = (proc, write_fd, guard)
    return proc


def _disarm(proc: subprocess.Popen[bytes]) -> None:
    entry = _WATCHDOGS.get(proc.pid)
    if entry is None or entry[0] is not proc:
        return
    del _WATCHDOGS[proc.pid]
    _, write_fd, guard = entry
    _stand_down(write_fd, guard)


def _stand_down(write_fd: int, guard: subprocess.Popen[bytes]) -> None:
    """Tell a watchdog not to kill (b"x"), close our end of its pipe and reap it."""
    with contextlib.suppress(OSError):
        os.write(write_fd, b"x")
    os.close(write_fd)
    with contextlib.suppress(subprocess.TimeoutExpired):
        guard.wait(timeout=5)


@atexit.register
def _sweep() -> None:
    """Stand down the watchdogs of leaders already reaped (their group id may be reused by a stranger)."""
    for proc, _, _ in list(_WATCHDOGS.values()):
        if proc.returncode is not None:
            _disarm(proc)


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> bool:
    """Send `sig` to the group led by `proc`, only while proc is unreaped (so its pid cannot be reused)."""
    if proc.returncode is not None:
        return False
    try:
        os.killpg(proc.pid, sig)
        return True
    except ProcessLookupError:
        return False


def _leader_exited(proc: subprocess.Popen[bytes], block: bool) -> bool:
    """Whether the leader has exited, without reaping it (WNOWAIT), so its group id stays ours."""
    flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
    try:
        return os.waitid(os.P_PID, proc.pid, flags) is not None
    except ChildProcessError:  # already reaped by someone else
        return True


def wait_group(
    proc: subprocess.Popen[bytes], timeout: float | None = None, poll_s: float = 0.05,
    on_exit: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> int:
    """Wait for the leader; then SIGKILL what it left running in its group, reap it, return its returncode.

    `on_exit` runs once the leader has exited, before that kill (to name what is left). Raises
    subprocess.TimeoutExpired after `timeout` seconds (nothing is signalled then).
    """
    if proc.returncode is None:
        if timeout is None:
            _leader_exited(proc, block=True)
        else:
            deadline = time.monotonic() + timeout
            while not _leader_exited(proc, block=False):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(proc.args, timeout)
                time.sleep(min(poll_s, left))
        if on_exit is not None:
            on_exit(proc)
        if signal_group(proc, signal.SIGKILL):  # leftovers would keep devices after the lock is released
            _await_group_end(proc.pid)
        proc.wait()
    _disarm(proc)
    return proc.returncode


def group_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, name) of the live processes of a process group, its exited leader left out."""
    out = []
    for p in psutil.process_iter(["pid", "name", "status"]):
        try:
            if p.pid != pgid and os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append((p.pid, str(p.info["name"])))
        except (OSError, psutil.Error):
            continue
    return out


def _await_group_end(pgid: int, limit_s: float = 30.0, poll_s: float = 0.01) -> None:
    """After a SIGKILL, wait until no member of the group is left alive (a killed process is still running until
    the kernel has torn it down: its devices and memory are freed only then). The leader, unreaped, keeps the
    group id ours meanwhile. Bounded: a process stuck in the kernel is not waited for beyond `limit_s`."""
    deadline = time.monotonic() + limit_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(poll_s)


def terminate_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> int:
    """SIGTERM the group, SIGKILL it after `grace_s`; returns the leader's returncode (negative: signal)."""
    signal_group(proc, signal.SIGTERM)
    try:
        return wait_group(proc, timeout=grace_s)
    except subprocess.TimeoutExpired:
        signal_group(proc, signal.SIGKILL)
        return wait_group(proc)


def exit_status(returncode: int) -> int:
    """A shell's view of a child's end: its exit code, or 128 + signal number when a signal killed it."""
    return 128 - returncode if returncode < 0 else returncode
