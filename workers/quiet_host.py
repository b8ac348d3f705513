"""Observes the host around one train package: load, CPU steal, the busiest foreign processes, GPU clocks.

Observe only: nothing is changed on the card or the host, nobody is signalled. No torch.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import psutil

from protocol.host.gpu_library import gpu_library, lib_call, lib_const, lib_fn
from protocol.host.quiet_host import ForeignGpuProcess, ForeignProcess, GpuState, QuietHost, public_name

TOP = 5
PID_NAMESPACE_ENV = "ORCH_PACKAGE_PID_NAMESPACE"  # set by orchestrator/isolation/ns_init.py (the same literal there)
_THROTTLE = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}  # fmt: skip


def _own_pids() -> set[int]:
    """This worker, its ancestors (orch) and its descendants (torchrun, the ranks): not foreign."""
    me = psutil.Process()
    own = {me.pid}
    for p in me.parents():
        own.add(p.pid)
    for p in me.children(recursive=True):
        own.add(p.pid)
    return own


def _proc_stat() -> tuple[int, int] | None:
    """(steal, total) jiffies of all CPUs from /proc/stat."""
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (values[7] if len(values) > 7 else 0), sum(values)


_public_name = public_name  # one definition (protocol.host.quiet_host); orch's host watch uses it too


def _cpu_times() -> dict[int, tuple[str, float]]:
    out = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        try:
            times = p.info["cpu_times"]
            if times is not None:
                out[p.pid] = (_public_name(p.info["name"]), float(times.user + times.system))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _gpu_states(indices: list[int], own: set[int]) -> tuple[list[GpuState], str]:
    try:
        lib = gpu_library()
        lib_call(lib, "Init")
    except Exception as exc:  # no library, no driver: a CPU host
        return [], f"no NVML ({type(exc).__name__})"
    states = []
    try:
        count = lib_call(lib, "DeviceGetCount")
        for index in indices or range(count):
            if index >= count:
                continue
            h = lib_call(lib, "DeviceGetHandleByIndex", index)
            states.append(_gpu_state(lib, h, index, own))
    except lib.NVMLError as exc:
        return states, f"NVML error ({exc})"
    finally:
        try:
            lib_call(lib, "Shutdown")
        except Exception:
            pass
    return states, "ok"


def _try(fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception:
        return None


def _gpu_state(lib: Any, h: Any, index: int, own: set[int]) -> GpuState:
    reasons_fn = lib_fn(lib, "DeviceGetCurrentClocksEventReasons") or lib_fn(
        lib, "DeviceGetCurrentClocksThrottleReasons"
    )
    mask = _try(reasons_fn, h) if reasons_fn else None
    power = _try(lib_fn(lib, "DeviceGetPowerUsage"), h)
    foreign = []
    for getter in (lib_fn(lib, "DeviceGetComputeRunningProcesses"), lib_fn(lib, "DeviceGetGraphicsRunningProcesses")):
        for proc in _try(getter, h) or []:
            if proc.pid in own:
                continue
            name = _public_name(_try(lambda pid: psutil.Process(pid).name(), proc.pid))
            used = getattr(proc, "usedGpuMemory", None)
            foreign.append(ForeignGpuProcess(name=name, used_mib=None if used is None else used / 2**20))
    clock = lib_fn(lib, "DeviceGetClockInfo")
    return GpuState(
        index=index,
        sm_mhz=_try(clock, h, lib_const(lib, "CLOCK_SM")),
        mem_mhz=_try(clock, h, lib_const(lib, "CLOCK_MEM")),
        temperature_c=_try(lib_fn(lib, "DeviceGetTemperature"), h, lib_const(lib, "TEMPERATURE_GPU")),
        power_w=None if power is None else power / 1000.0,
        throttle=[] if mask is None else [name for bit, name in _THROTTLE.items() if mask & bit],
        foreign=foreign,
    )


def _visible() -> list[int]:
    raw = os.environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return []
    return [int(x) for x in raw.split(",") if x.strip().isdigit()]


@dataclass
class HostWatch:
    """`start()` before the trainer, `finish()` after it: the QuietHost report of what happened in between."""

    t0: float = 0.0
    load0: tuple[float, float, float] = (0.0, 0.0, 0.0)
    stat0: tuple[int, int] | None = None
    cpu0: dict[int, tuple[str, float]] = field(default_factory=dict)
    gpus0: list[GpuState] = field(default_factory=list)
    gpu_query: str = ""

    def start(self) -> None:
        own = _own_pids()
        self.gpus0, self.gpu_query = _gpu_states(_visible(), own)
        self.load0 = os.getloadavg()
        self.stat0 = _proc_stat()
        self.cpu0 = {pid: v for pid, v in _cpu_times().items() if pid not in own}
        self.t0 = time.monotonic()

    def finish(self) -> QuietHost:
        wall = max(time.monotonic() - self.t0, 1e-9)
        own = _own_pids()
        cpu1 = _cpu_times()
        stat1 = _proc_stat()
        load1 = os.getloadavg()
        gpus1, gpu_query = _gpu_states(_visible(), own)
        busy = []
        for pid, (name, before) in self.cpu0.items():
            after = cpu1.get(pid)
            if after is None or after[0] != name or pid in own:
                continue
            used = after[1] - before
            if used > 0:
                busy.append(ForeignProcess(name=name, cpu_s=round(used, 3), core_share=round(used / wall, 4)))
        busy.sort(key=lambda p: (-p.cpu_s, p.name))
        steal = None
        if self.stat0 is not None and stat1 is not None and stat1[1] > self.stat0[1]:
            steal = (stat1[0] - self.stat0[0]) / (stat1[1] - self.stat0[1])
        return QuietHost(
            wall_s=round(wall, 3), cpus=os.cpu_count() or 0, load_start=[round(x, 2) for x in self.load0],
            load_end=[round(x, 2) for x in load1], steal=None if steal is None else round(steal, 5),
            busy_foreign=busy[:TOP], gpus_start=self.gpus0, gpus_end=gpus1,
            gpu_query=self.gpu_query if self.gpu_query != "ok" else gpu_query,
            own_pid_namespace=os.environ.get(PID_NAMESPACE_ENV) == "1",
        )
