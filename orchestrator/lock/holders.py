"""Who holds a GPU or CPU slot: holders of the lock files (from /proc/locks and their info) and foreign GPU users.

What the lock prints while it waits and names when it times out; it never stops anyone.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psutil

from orchestrator.lock.gpu_devices import DeviceProbe

Kind = Literal["gpu", "cpu-slot"]


def lock_label(kind: Kind, index: int) -> str:
    return f"gpu{index}" if kind == "gpu" else f"slot{index}"


def utc_iso(ts: float | None = None) -> str:
    dt = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


@dataclass(frozen=True)
class Holder:
    """Who keeps one device busy: a lock holder, or a process NVML sees on the GPU."""

    label: str  # gpu3 / slot1 / .guard
    reason: Literal["lock", "device"]  # a lock file, or the driver's list of processes on the GPU
    pid: int | None = None
    user: str | None = None
    command: str | None = None
    since: str | None = None  # UTC ISO
    since_what: str = "locked"  # "locked" (from the holder's own record) or "running" (process start)
    used_mib: float | None = None
    gpu_run: bool = False  # the holder wrote gpu-run holder info

    def describe(self) -> str:
        where = "lock held by" if self.reason == "lock" else "in use (NVML) by"
        if self.pid is None:
            return f"{self.label}: {where} an unknown holder (a foreign flock; its process is not visible)"
        facts = [f"user {self.user or '?'}"]
        if self.used_mib is not None:
            facts.append("memory unknown" if self.used_mib < 0 else f"{self.used_mib:.0f} MiB")
        if self.since:
            facts.append(f"{self.since_what} since {self.since}")
        if self.reason == "lock" and not self.gpu_run:
            facts.append("not a gpu-run")
        cmd = self.command or "?"
        if len(cmd) > 160:
            cmd = cmd[:157] + "..."
        return f"{self.label}: {where} pid {self.pid} ({', '.join(facts)}): {cmd}"


def _proc_facts(pid: int) -> tuple[str | None, str | None, float | None]:
    """(user, command, start time) of a process, as far as this user may see them."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None, None, None
    user = cmd = None
    start: float | None = None
    with contextlib.suppress(psutil.Error):
        user = proc.username()
    with contextlib.suppress(psutil.Error):
        cmd = shlex.join(proc.cmdline()) or proc.name()
    with contextlib.suppress(psutil.Error):
        start = proc.create_time()
    return user, cmd, start


def read_proc_locks() -> dict[tuple[int, int, int], list[int]]:
    """flock holders by (major, minor, inode) from /proc/locks, readable by every user."""
    out: dict[tuple[int, int, int], list[int]] = {}
    try:
        text = Path("/proc/locks").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 6 or parts[1] == "->" or parts[1] != "FLOCK":
            continue  # "->" lines are waiters, not holders
        try:
            pid = int(parts[4])
            major, minor, ino = parts[5].split(":")
            key = (int(major, 16), int(minor, 16), int(ino))
        except ValueError:
            continue
        if pid > 0:
            out.setdefault(key, []).append(pid)
    return out


def _pids_with_file_open(path: Path) -> list[int]:
    """Fallback when /proc/locks names nobody: the processes (we may inspect) that have `path` open."""
    target = str(path.resolve())
    found: list[int] = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(f.path == target for f in proc.open_files()):
                found.append(proc.pid)
    return found


def _read_holder_info(path: Path) -> dict[str, Any] | None:
    try:
        raw = path.read_bytes()[:65536]
        doc = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def lock_holders(
    path: Path, label: str, proc_locks: dict[tuple[int, int, int], list[int]] | None = None
) -> list[Holder]:
    """Describe whoever holds the flock on `path` (call only when the lock was found busy)."""
    locks = read_proc_locks() if proc_locks is None else proc_locks
    try:
        st = path.stat()
        pids = locks.get((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino), [])
    except OSError:
        pids = []
    info = _read_holder_info(path)
    if not pids and info is not None and isinstance(info.get("pid"), int):
        _, _, start = _proc_facts(info["pid"])
        if start is not None and abs(start - float(info.get("pid_start", -1))) < 1.0:
            pids = [info["pid"]]  # a live gpu-run whose record matches its process start time
    if not pids:
        pids = _pids_with_file_open(path)
    if not pids:
        return [Holder(label=label, reason="lock")]
    holders = []
    for pid in sorted(set(pids)):
        user, cmd, start = _proc_facts(pid)
        if info is not None and info.get("pid") == pid:
            holders.append(
                Holder(
                    label,
                    "lock",
                    pid,
                    str(info.get("user", user)),
                    str(info.get("cmd", cmd)),
                    str(info.get("since")),
                    "locked",
                    gpu_run=True,
                )
            )
        else:
            since = utc_iso(start) if start is not None else None
            holders.append(Holder(label, "lock", pid, user, cmd, since, "running"))
    return holders


def own_tree() -> set[int]:
    """This process, its ancestors and its descendants: their GPU use is ours, not a foreign job's."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.parents())
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.children(recursive=True))
    return pids


def device_holders(probe: DeviceProbe, index: int, min_foreign_mib: float, own: set[int]) -> list[Holder]:
    """Processes outside our tree using GPU `index` above the threshold (unknown usage counts as above)."""
    holders = []
    for pid, used in probe.foreign_users(index):
        if pid in own:
            continue
        mib = used / 2**20 if used >= 0 else -1.0
        if 0 <= mib < min_foreign_mib:
            continue  # display servers and the like
        user, cmd, start = _proc_facts(pid)
        since = utc_iso(start) if start is not None else None
        holders.append(Holder(lock_label("gpu", index), "device", pid, user, cmd, since, "running", mib))
    return holders
