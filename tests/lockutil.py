"""Helpers shared by the lock tests: is a lock file free right now, has a process ended."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import psutil


def is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # reparented, not yet reaped by init
    except psutil.NoSuchProcess:
        return True
