"""The quiet-host report of one train package: what else the host was doing while it ran (observed only).

Process names only (never command lines, users or paths), the host name never; NVML figures when a GPU is there.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

HOST_WATCH_SCHEMA = "orch.host_watch/1"
HOST_WATCH_FILE = "host_watch.json"  # in the train package's directory, written by orch (not by the package)


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def public_name(name: str | None) -> str:
    """A process name fit for evidence: a kernel thread's "kworker/u4:2" becomes "kworker" (its name
    never carries a path), and a name equal to this host's is withheld."""
    head = (name or "?").split("/", 1)[0] or "?"
    return "<host>" if head == os.uname().nodename else head


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
    # taken inside the package's own PID namespace (orch's namespace isolation): there /proc and the GPU driver
    # show that namespace's processes only, so busy_foreign and each GpuState.foreign are blind to other jobs (the
    # host watch, run by orch outside the namespace, sees them); None: recorded before this was known
    own_pid_namespace: bool | None = None

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


class WatchBusy(_Doc):
    name: str
    cpu_s: float  # CPU seconds it used in the interval


class WatchGpu(_Doc):
    index: int  # the GPU (NVML index)
    name: str


class WatchUtil(_Doc):
    """A GPU's busy share over one watch interval: NVML's utilisation samples (the fraction of each sample period in
    which a kernel ran) that arrived since the previous watch sample, averaged."""

    index: int  # the GPU (NVML index)
    busy: float  # 0..1
    samples: int  # NVML samples averaged (1 where only the current rate could be read)


class WatchSample(_Doc):
    """What foreign processes did between the previous sample and this one (the first sample only sets the base)."""

    t_s: float  # seconds since the watch started (orch's CLOCK_MONOTONIC)
    steps_done: int  # step lines rank 0's probe had written: step `steps_done` was running (the window mapping)
    foreign_s: dict[str, float] = {}  # core of the ranks -> foreign CPU seconds on it since the previous sample
    other_s: float = 0.0  # foreign CPU seconds on the other cores
    blocks: list[list[int]] = []  # the ranks' cores (their affinity, one block each); [] = not pinned: all cores
    top: list[WatchBusy] = []  # the busiest foreign processes of the interval
    gpu_foreign: list[WatchGpu] = []  # foreign compute or graphics processes on the package's GPUs at this sample
    gpu_unresolved: int = 0  # GPU process ids not in this PID namespace: neither ours nor known foreign
    gpu_util: list[WatchUtil] = []  # how busy each of the package's GPUs was since the previous sample


class HostWatchLog(_Doc):
    """host_watch.json: the samples orch took while one train package ran (orchestrator.run.host_watch)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str = Field(HOST_WATCH_SCHEMA, alias="schema")
    interval_s: float
    cpus: list[int]  # the cores orch may run on (its affinity): the ranks' cores when they are not pinned
    gpus: list[int]  # the GPUs watched (NVML indices); [] for a CPU package
    gpu_query: str  # "ok", or why there are no GPU figures
    cpu_query: str  # "ok", or why there are no CPU figures
    # "ok" (per-interval NVML utilisation samples), "rate" (only the current rate), or why GPU-busy was not read;
    # None: recorded before GPU-busy was sampled
    gpu_util_query: str | None = None
    wall_s: float
    sampler_cpu_s: float  # CPU time of the sampling thread itself (its overhead)
    samples: list[WatchSample]


class HostWatchRef(_Doc):
    """run.json's pointer to a train package's host_watch.json: the file and its SHA256 (checked by the audit)."""

    file: str  # relative to the package directory
    sha256: str
    samples: int
    sampler_cpu_s: float
