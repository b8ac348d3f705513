"""The GPUs the lock sees: how many, and which processes use each one (NVML, or a JSON file standing in for it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from protocol.errors import UsageError
from protocol.host.gpu_library import gpu_library, lib_call

ENV_FAKE_NVML = "GPU_RUN_FAKE_NVML"
UNKNOWN_BYTES = -1  # NVML could not say how much memory a process uses: treated as busy


class DeviceProbe(Protocol):
    """What the lock needs to know about the GPUs: how many, and which processes use each one."""

    def count(self) -> int:
        """Number of GPUs on this host (0: none, or no driver; the lock then uses CPU slots)."""
        ...

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        """(pid, bytes or UNKNOWN_BYTES) of each process on GPU `index`; the lock judges who is foreign."""
        ...


class DriverProbe:
    """The real probe, through nvidia-ml-py (NVML); a host without a driver counts 0 GPUs."""

    def __init__(self) -> None:
        self._ok: bool | None = None

    def _init(self) -> bool:
        if self._ok is None:
            lib = gpu_library()
            try:
                lib_call(lib, "Init")
                self._ok = True
            except (lib.NVMLError, OSError):  # no library or no driver: a CPU host
                self._ok = False
        return self._ok

    def count(self) -> int:
        return int(lib_call(gpu_library(), "DeviceGetCount")) if self._init() else 0

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        if not self._init():
            return []
        lib = gpu_library()
        handle = lib_call(lib, "DeviceGetHandleByIndex", index)
        users: dict[int, int] = {}
        for getter in ("DeviceGetComputeRunningProcesses", "DeviceGetGraphicsRunningProcesses"):
            try:
                procs = lib_call(lib, getter, handle)
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
    return FakeProbe(Path(fake)) if fake else DriverProbe()
