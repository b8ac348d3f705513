"""The one die-with-parent helper (PR_SET_PDEATHSIG) of orch's launcher, its package runner and its workers.

A process that must not outlive its parent arms it; if the parent is already gone when it is armed, it dies at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGKILL, *, parent: int | None = None) -> Callable[[], None]:
    """A function that, run in a process, makes the kernel send it `sig` when its parent thread exits.

    Build it in the parent and pass it as a Popen `preexec_fn` (`parent` defaults to this process), or call it at
    once in a process about itself with `parent=os.getppid()`. libc is loaded here, never in a forked child; if the
    parent died before prctl took effect, the process SIGKILLs itself. OSError or AttributeError where there is
    no prctl (not Linux).
    """
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    parent_pid = os.getpid() if parent is None else parent

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def process_started(pid: int | str = "self") -> float | None:
    """When a process was created, as a Unix time: the kernel's start time (clock ticks after boot) read against
    CLOCK_BOOTTIME now, so that it compares with time.time() to a tick (/proc/stat's boot time has whole seconds
    only); None where /proc cannot tell (not Linux). Start-up figures only, never a measurement."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        ticks = int(stat[stat.rindex(b")") + 2 :].split()[19])  # field 22 (starttime); the name may hold spaces
        now, since_boot = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
        return now - (since_boot - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError, AttributeError):
        return None
