"""The shared-host GPU lock: one flock(2) file per GPU (or CPU slot), taken all at once or not at all.

Children run under it through orchestrator/process_group.py, which keeps them from outliving their parent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import pwd
import random
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Protocol

import psutil

from protocol.errors import LockTimeoutError, UsageError

ENV_LOCK_DIR = "GPU_RUN_LOCK_DIR"
ENV_SLOTS = "GPU_RUN_SLOTS"
ENV_FAKE_NVML = "GPU_RUN_FAKE_NVML"
DEFAULT_MIN_FOREIGN_MIB = 256.0
GUARD_NAME = ".guard"
UNKNOWN_BYTES = -1  # NVML could not say how much memory a process uses: treated as busy

Kind = Literal["gpu", "cpu-slot"]
StatusFn = Callable[[str], None]


# ---------------------------------------------------------------- device probes


class DeviceProbe(Protocol):
    """What the lock needs to know about the GPUs: how many, and which processes use each one."""

    def count(self) -> int:
        """Number of GPUs on this host (0: none, or no driver; the lock then uses CPU slots)."""
        ...

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        """(pid, bytes or UNKNOWN_BYTES) of each process on GPU `index`; the lock judges who is foreign."""
        ...


def _gpu_library() -> Any:
    """nvidia-ml-py, imported when a GPU is first probed: commands that never look at a GPU do not load it."""
    import pynvml

    return pynvml


class NvmlProbe:
    """The real probe, through nvidia-ml-py (NVML); a host without a driver counts 0 GPUs."""

    def __init__(self) -> None:
        self._ok: bool | None = None

    def _init(self) -> bool:
        if self._ok is None:
            lib = _gpu_library()
            try:
                lib.nvmlInit()
                self._ok = True
            except (lib.NVMLError, OSError):  # no library or no driver: a CPU host
                self._ok = False
        return self._ok

    def count(self) -> int:
        return int(_gpu_library().nvmlDeviceGetCount()) if self._init() else 0

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        if not self._init():
            return []
        lib = _gpu_library()
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        users: dict[int, int] = {}
        getters = (lib.nvmlDeviceGetComputeRunningProcesses, lib.nvmlDeviceGetGraphicsRunningProcesses)
        for getter in getters:
            try:
                procs = getter(handle)
            except lib.NVMLError:  # e.g. graphics queries unsupported on compute-only boards
                continue
            for p in procs:
                used = UNKNOWN_BYTES if p.usedGpuMemory is None else int(p.usedGpuMemory)
                prev = users.get(int(p.pid))
                users[int(p.pid)] = used if prev is None or prev == UNKNOWN_BYTES else max(prev, used)
        return sorted(users.items())


class FakeProbe:
    """A probe read from a JSON file, re-read at each call so tests can occupy and free GPUs without hardware.

    Format: {"devices": [{"processes": [{"pid": 123, "used_mib": 1024}]}, {"processes": []}]};
    "used_mib": null means NVML could not tell. {"devices": []} is a host without GPUs.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def _devices(self) -> list[dict[str, Any]]:
        doc = json.loads(self.path.read_text())
        devices = doc["devices"]
        if not isinstance(devices, list):
            raise UsageError(f"{ENV_FAKE_NVML}={self.path}: 'devices' must be a list")
        return devices

    def count(self) -> int:
        return len(self._devices())

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for p in self._devices()[index].get("processes", []):
            mib = p.get("used_mib")
            out.append((int(p["pid"]), UNKNOWN_BYTES if mib is None else int(float(mib) * 2**20)))
        return out


def probe_from_env(env: Mapping[str, str] | None = None) -> DeviceProbe:
    """$GPU_RUN_FAKE_NVML (a JSON file, see FakeProbe) if set, else the real NVML probe."""
    fake = (os.environ if env is None else env).get(ENV_FAKE_NVML)
    return FakeProbe(Path(fake)) if fake else NvmlProbe()


# ---------------------------------------------------------------- lock directory and files


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """$GPU_RUN_LOCK_DIR, else /var/lock/gpu-run when it is (or can be made) writable, else /tmp/gpu-run."""
    value = (os.environ if env is None else env).get(ENV_LOCK_DIR)
    if value:
        return Path(value)
    var = Path("/var/lock/gpu-run")
    if var.is_dir():
        if os.access(var, os.W_OK | os.X_OK):
            return var
    elif os.access(var.parent, os.W_OK | os.X_OK):
        return var
    return Path("/tmp/gpu-run")


def ensure_lock_dir(path: Path) -> Path:
    """Create the host-wide lock directory, sticky and world-writable (1777) so every user can lock."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        path.mkdir()
        os.chmod(path, 0o1777)  # mkdir's mode is filtered by the umask
    except FileExistsError:
        pass
    if not path.is_dir():
        raise UsageError(f"lock directory {path} is not a directory; pass --lock-dir or set {ENV_LOCK_DIR}")
    return path


def resolve_slots(slots: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """CPU slot count: `slots`, else $GPU_RUN_SLOTS, else os.cpu_count()."""
    if slots is None:
        raw = (os.environ if env is None else env).get(ENV_SLOTS)
        if raw:
            try:
                slots = int(raw)
            except ValueError:
                raise UsageError(f"{ENV_SLOTS}={raw!r} is not an integer; set it to a slot count") from None
        else:
            slots = os.cpu_count() or 1
    if slots < 1:
        raise UsageError(f"slot count must be at least 1, got {slots}")
    return slots


def lock_label(kind: Kind, index: int) -> str:
    return f"gpu{index}" if kind == "gpu" else f"slot{index}"


def lock_path(lock_dir: Path, kind: Kind, index: int) -> Path:
    return lock_dir / f"{lock_label(kind, index)}.lock"


def _open_lock_file(path: Path) -> tuple[int, bool]:
    """Open (creating 0666) a lock file; returns (fd, writable). Never follows a symlink planted in /tmp."""
    flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_RDWR, 0o666)
        writable = True
    except PermissionError:  # another user's file without group/other write: flock works read-only too
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        writable = False
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.getuid():
            os.fchmod(fd, 0o666)  # the creation mode is filtered by the umask
    return fd, writable


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


def _take_guard_briefly(lock_dir: Path, within_s: float = 2.0) -> int | None:
    """The guard fd, locked, if it can be had within `within_s` (it is only ever held for milliseconds)."""
    fd, _ = _open_lock_file(lock_dir / GUARD_NAME)
    deadline = time.monotonic() + within_s
    while not _try_flock(fd):
        if time.monotonic() >= deadline:
            os.close(fd)
            return None  # a stuck foreign holder of .guard: release without it rather than hang
        time.sleep(0.002)
    return fd


def _utc_iso(ts: float | None = None) -> str:
    dt = datetime.now(UTC) if ts is None else datetime.fromtimestamp(ts, UTC)
    return dt.isoformat(timespec="seconds").replace("+00:00", "Z")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


# ---------------------------------------------------------------- holders


@dataclass(frozen=True)
class Holder:
    """Who keeps one device busy: a lock holder, or a process NVML sees on the GPU."""

    label: str  # gpu3 / slot1 / .guard
    reason: Literal["lock", "nvml"]
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


def _read_proc_locks() -> dict[tuple[int, int, int], list[int]]:
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
    locks = _read_proc_locks() if proc_locks is None else proc_locks
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
            since = _utc_iso(start) if start is not None else None
            holders.append(Holder(label, "lock", pid, user, cmd, since, "running"))
    return holders


def _own_tree() -> set[int]:
    """This process, its ancestors and its descendants: their GPU use is ours, not a foreign job's."""
    me = psutil.Process()
    pids = {me.pid}
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.parents())
    with contextlib.suppress(psutil.Error):
        pids.update(p.pid for p in me.children(recursive=True))
    return pids


def nvml_holders(probe: DeviceProbe, index: int, min_foreign_mib: float, own: set[int]) -> list[Holder]:
    """Processes outside our tree using GPU `index` above the threshold (unknown usage counts as above)."""
    holders = []
    for pid, used in probe.foreign_users(index):
        if pid in own:
            continue
        mib = used / 2**20 if used >= 0 else -1.0
        if 0 <= mib < min_foreign_mib:
            continue  # display servers and the like
        user, cmd, start = _proc_facts(pid)
        since = _utc_iso(start) if start is not None else None
        holders.append(Holder(lock_label("gpu", index), "nvml", pid, user, cmd, since, "running", mib))
    return holders


# ---------------------------------------------------------------- the grant


@dataclass(eq=False)
class Grant:
    """Devices held by this process until release(); a context manager. Lock fds are close-on-exec."""

    devices: list[int]
    kind: Kind
    wait_s: float
    acquired_at: datetime  # UTC
    lock_dir: Path
    _fds: list[int] = field(repr=False)
    _t_acquired: float = field(repr=False)  # time.monotonic()
    _t_released: float | None = field(default=None, repr=False)

    @property
    def cuda_visible_devices(self) -> str:
        """GPU indices for CUDA_VISIBLE_DEVICES; "" for CPU slots (a slot grant grants no GPU)."""
        return ",".join(map(str, self.devices)) if self.kind == "gpu" else ""

    @property
    def labels(self) -> list[str]:
        return [lock_label(self.kind, i) for i in self.devices]

    @property
    def released(self) -> bool:
        return self._t_released is not None

    def held_s(self) -> float:
        """Seconds held so far (frozen at release)."""
        end = time.monotonic() if self._t_released is None else self._t_released
        return end - self._t_acquired

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for a command run under this grant (`base` defaults to os.environ)."""
        out = dict(os.environ if base is None else base)
        devices = ",".join(map(str, self.devices))
        out["CUDA_VISIBLE_DEVICES"] = self.cuda_visible_devices
        out["GPU_RUN_KIND"] = self.kind
        out["GPU_RUN_DEVICES"] = devices
        if self.kind == "gpu":
            out["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML numbers GPUs in PCI order; make CUDA agree
            out.pop("GPU_RUN_SLOTS_GRANTED", None)
        else:
            out["GPU_RUN_SLOTS_GRANTED"] = devices
        return out

    def release(self) -> None:
        """Drop every lock (idempotent). Holder info is cleared first, while the lock is still ours."""
        if self._t_released is not None:
            return
        self._t_released = time.monotonic()
        fds, self._fds = self._fds, []
        guard = None
        if len(fds) > 1:
            with contextlib.suppress(OSError):  # e.g. the lock directory was removed: release without it
                guard = _take_guard_briefly(self.lock_dir)
        try:  # under the guard, no attempt sees part of this grant free (lowest-free stays exact)
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                os.close(fd)  # closing the last fd of the open file description releases the flock
        finally:
            if guard is not None:
                os.close(guard)

    def __enter__(self) -> Grant:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


class GpuLockTimeout(LockTimeoutError):
    """Not obtained in time (exit 75); `holders` are who kept the devices busy at the last attempt."""

    def __init__(self, message: str, holders: list[Holder]) -> None:
        super().__init__(message)
        self.holders = holders


# ---------------------------------------------------------------- acquisition


@dataclass
class _Attempt:
    fds: list[tuple[int, int, bool]]  # (device, fd, writable)
    holders: list[Holder]


def _release_fds(fds: Sequence[tuple[int, int, bool]]) -> None:
    for _, fd, _ in fds:
        os.close(fd)


def _try_take(
    lock_dir: Path,
    kind: Kind,
    candidates: list[int],
    need: int,
    exact: bool,
    probe: DeviceProbe,
    min_foreign_mib: float,
) -> _Attempt:
    """One all-or-none attempt under the guard: the `need` lowest free candidates, or nothing held."""
    guard_fd = _take_guard_briefly(lock_dir, within_s=0.2)
    if guard_fd is None:  # someone sits on the guard far longer than an attempt or a release takes
        return _Attempt([], lock_holders(lock_dir / GUARD_NAME, GUARD_NAME))
    try:
        taken: list[tuple[int, int, bool]] = []
        holders: list[Holder] = []
        own: set[int] | None = None
        proc_locks: dict[tuple[int, int, int], list[int]] | None = None
        try:
            for index in candidates:
                if len(taken) == need:
                    break
                path = lock_path(lock_dir, kind, index)
                fd, writable = _open_lock_file(path)
                if not _try_flock(fd):
                    os.close(fd)
                    proc_locks = _read_proc_locks() if proc_locks is None else proc_locks
                    holders.extend(lock_holders(path, lock_label(kind, index), proc_locks))
                elif kind == "gpu" and (
                    busy := nvml_holders(probe, index, min_foreign_mib, own := _own_tree() if own is None else own)
                ):
                    os.close(fd)  # lock free, but someone outside gpu-run computes on it
                    holders.extend(busy)
                else:
                    taken.append((index, fd, writable))
                    continue
                if exact:
                    break
        except BaseException:
            _release_fds(taken)
            raise
        if len(taken) < need:
            _release_fds(taken)  # all or none: never sit on part of a request
            return _Attempt([], holders)
        return _Attempt(taken, [])
    finally:
        os.close(guard_fd)


def _write_holder_info(fd: int, info: dict[str, Any]) -> None:
    data = json.dumps(info, sort_keys=True).encode() + b"\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def acquire(
    gpus: int | None = None,
    devices: list[int] | None = None,
    timeout: float | None = None,
    lock_dir: Path | None = None,
    status: StatusFn | None = None,
    *,
    slots: int | None = None,
    probe: DeviceProbe | None = None,
    min_foreign_mib: float = DEFAULT_MIN_FOREIGN_MIB,
    command: str | None = None,
) -> Grant:
    """Wait for and lock `gpus` lowest free GPUs (default 1) or exactly `devices`; all at once or none.

    Without GPUs (probe counts 0) the same happens with CPU slots. `timeout` None waits forever, 0 tries
    once. `status` gets one line each time the set of holders changes while waiting. Raises UsageError
    (exit 2) for a request this host can never satisfy, GpuLockTimeout (a LockTimeoutError, exit 75).
    """
    if gpus is not None and devices is not None:
        raise UsageError("give either a GPU count or a device list, not both")
    probe = probe_from_env() if probe is None else probe
    n_gpus = probe.count()
    kind: Kind = "gpu" if n_gpus > 0 else "cpu-slot"
    total = n_gpus if kind == "gpu" else resolve_slots(slots)
    noun = "GPU" if kind == "gpu" else "CPU slot"
    if devices is not None:
        if not devices or len(set(devices)) != len(devices) or any(d < 0 or d >= total for d in devices):
            raise UsageError(f"devices {devices} are not distinct {noun} indices in 0..{total - 1} here")
        candidates, need, exact = sorted(devices), len(devices), True
    else:
        need = 1 if gpus is None else gpus
        if not 1 <= need <= total:
            raise UsageError(f"asked for {need} {noun}s but this host has {total}; ask for 1..{total}")
        candidates, exact = list(range(total)), False
    if timeout is not None and timeout < 0:
        raise UsageError(f"timeout must be >= 0 seconds, got {timeout}")
    lock_dir = ensure_lock_dir(default_lock_dir() if lock_dir is None else lock_dir)
    plural = "s" if need > 1 else ""
    want = f"{noun}{plural} {','.join(map(str, candidates))}" if exact else f"{need} {noun}{plural}"

    t0 = time.monotonic()
    deadline = None if timeout is None else t0 + timeout
    last_status = None
    for attempt in itertools.count():
        got = _try_take(lock_dir, kind, candidates, need, exact, probe, min_foreign_mib)
        now = time.monotonic()
        if got.fds:
            me = psutil.Process()
            info = {
                "pid": me.pid,
                "pid_start": me.create_time(),
                "user": _user_name(os.getuid()),
                "cmd": command if command is not None else shlex.join(me.cmdline()),
                "since": _utc_iso(),
                "kind": kind,
                "devices": [d for d, _, _ in got.fds],
            }
            for _, fd, writable in got.fds:
                if writable:
                    _write_holder_info(fd, info)
            return Grant(
                devices=[d for d, _, _ in got.fds],
                kind=kind,
                wait_s=now - t0,
                acquired_at=datetime.now(UTC),
                lock_dir=lock_dir,
                _fds=[fd for _, fd, _ in got.fds],
                _t_acquired=now,
            )
        line = f"waiting for {want} in {lock_dir}: " + "; ".join(h.describe() for h in got.holders)
        if deadline is not None and now >= deadline:
            lines = "\n".join(h.describe() for h in got.holders)
            raise GpuLockTimeout(
                f"could not get {want} within {timeout:g} s in {lock_dir} (nobody was stopped; "
                f"retry later or raise the timeout); busy:\n{lines}",
                got.holders,
            )
        if status is not None and line != last_status:
            status(line)
        last_status = line
        # back off with jitter so contenders do not retry in lock-step
        delay = min(0.5, 0.05 * 1.5 ** min(attempt, 20)) * random.uniform(0.75, 1.25)
        time.sleep(delay if deadline is None else max(0.0, min(delay, deadline - now)))
    raise AssertionError("unreachable")  # itertools.count() never ends
