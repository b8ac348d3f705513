"""A cgroup v2 per package (where this user may make one): every process the package starts stays in it, also one
that double-forks into a new session with a cleared environment; `cgroup.kill` ends them all at once.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path


def _v2_mount() -> str | None:
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                if fields[sep + 1] == "cgroup2":
                    return fields[4]
    except (OSError, ValueError, IndexError):
        return None
    return None


def _own_path() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        return None
    return None


def parent_dir() -> Path | None:
    """This process's own cgroup v2 folder, where packages' cgroups are made; None without cgroup v2 or cgroup.kill."""
    mount, own = _v2_mount(), _own_path()
    if mount is None or own is None:
        return None
    path = Path(mount) / own.lstrip("/")
    return path if path.is_dir() and os.access(path, os.W_OK) else None


class PackageCgroup:
    """The cgroup of one package: made before it starts, joined by its first process, killed and removed after."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, name: str) -> PackageCgroup | None:
        parent = parent_dir()
        if parent is None:
            return None
        path = parent / name
        try:
            path.mkdir()
        except OSError:
            return None
        if not (path / "cgroup.kill").is_file():  # kernels before 5.14
            with contextlib.suppress(OSError):
                path.rmdir()
            return None
        return cls(path)

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def members(self) -> list[tuple[int, str]]:
        """(pid, command name) of every live process in it."""
        try:
            pids = [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except OSError:
            return []
        out = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2 :].split(" ", 1)[0] not in ("Z", "X"):
                out.append((pid, stat[stat.index("(") + 1 : stat.rindex(")")]))
        return out

    def kill_and_remove(self, timeout_s: float = 10.0) -> None:
        """SIGKILL every process in it (cgroup.kill), wait until it is empty, remove it."""
        with contextlib.suppress(OSError):
            (self.path / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                self.path.rmdir()
                return
            time.sleep(0.02)


def joiner(procs_file: str) -> int:
    """Open the cgroup's procs file in the parent, for a child to join it before exec (preexec: write '0')."""
    return os.open(procs_file, os.O_WRONLY | os.O_CLOEXEC)
