"""The one die-with-parent helper (PR_SET_PDEATHSIG) of orch's launcher, its package runner and its workers.

A process that must not outlive its parent arms it; if the parent is already gone when it is armed, it dies at once.
"""

from __future__ import annotations

import ctypes
import os
import signal
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
