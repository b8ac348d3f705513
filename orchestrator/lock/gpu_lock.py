"""The shared-host GPU lock: one flock(2) file per GPU (or CPU slot), taken all at once or not at all.

Children run under it through orchestrator/isolation/process_group.py, which keeps them from outliving their parent.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import json
import os
import random
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from orchestrator.lock.gpu_devices import DeviceProbe, probe_from_env
from orchestrator.lock.holders import (
    Holder,
    Kind,
    device_holders,
    lock_holders,
    lock_label,
    own_tree,
    read_proc_locks,
    user_name,
    utc_iso,
)
from protocol.errors import LockTimeoutError, UsageError

ENV_LOCK_DIR = "GPU_RUN_LOCK_DIR"
ENV_SLOTS = "GPU_RUN_SLOTS"
DEFAULT_MIN_FOREIGN_MIB = 256.0
GUARD_NAME = ".guard"

StatusFn = Callable[[str], None]


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
                    proc_locks = read_proc_locks() if proc_locks is None else proc_locks
                    holders.extend(lock_holders(path, lock_label(kind, index), proc_locks))
                elif kind == "gpu" and (
                    busy := device_holders(probe, index, min_foreign_mib, own := own_tree() if own is None else own)
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
                "user": user_name(os.getuid()),
                "cmd": command if command is not None else shlex.join(me.cmdline()),
                "since": utc_iso(),
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
