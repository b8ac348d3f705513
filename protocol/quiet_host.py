"""The quiet-host report of one train package: what else the host was doing while it ran (observed only).

Process names only (never command lines, users or paths), the host name never; NVML figures when a GPU is there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ForeignProcess(_Doc):
    name: str
    cpu_s: float  # CPU seconds it used while the package ran
    core_share: float  # cpu_s / package wall time (1.0 = one core busy all along)


class ForeignGpuProcess(_Doc):
    name: str
    used_mib: float | None


class GpuState(_Doc):
    index: int
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    throttle: list[str] = []  # active clock event (throttle) reasons, NVML names without prefix
    foreign: list[ForeignGpuProcess] = []


class QuietHost(_Doc):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str = Field("orch.quiet_host/1", alias="schema")
    wall_s: float
    cpus: int
    load_start: list[float]  # 1, 5, 15-minute load averages
    load_end: list[float]
    steal: float | None  # CPU steal time / all CPU time over the package (from /proc/stat), None when unknown
    busy_foreign: list[ForeignProcess]  # the busiest processes outside orch and the trainer, by CPU used
    gpus_start: list[GpuState] = []
    gpus_end: list[GpuState] = []
    nvml: str  # "ok" or why there are no GPU figures

    @property
    def gpu_note(self) -> str:
        """Whether the GPU figures were read ("ok") or why there are none."""
        return self.nvml
