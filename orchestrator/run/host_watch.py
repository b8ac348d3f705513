"""The host watched through a train package: foreign CPU per core the ranks run on and foreign GPU processes,
sampled by a thread of orch every INTERVAL_S, mapped to steps by the probe's step counter, written as evidence.

Foreign: every process that is neither orch nor a descendant of it, nor carries the running package's token
(a Slurm rank started by slurmstepd). Observation only: nothing is signalled. Linux /proc; no GPU: skipped.
"""

from __future__ import annotations

import os
import shutil
import stat
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.isolation.stragglers import TOKEN_VAR
from orchestrator.run.gpu_busy import UtilSampler
from protocol.fileio import write_atomic
from protocol.hashing import canonical_json, sha256_file
from protocol.host.gpu_library import gpu_library, lib_call
from protocol.host.quiet_host import (
    HOST_WATCH_FILE,
    HostWatchLog,
    HostWatchRef,
    WatchBusy,
    WatchGpu,
    WatchSample,
    public_name,
)

INTERVAL_S = 0.25  # a 2-step window of r3-mini on CPU lasts about 0.5-2 s; each sample costs ~3 ms of CPU
TOP = 5  # the busiest foreign process names of each interval, CPU summed by name
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Proc:
    pid: int
    name: str
    ppid: int
    cpu_ticks: int  # utime + stime
    start: int  # start time in ticks since boot: (pid, start) names one process, pid reuse aside
    core: int  # the core its main thread last ran on
    threads: int


def read_proc(pid: int, path: str | None = None) -> Proc | None:
    """One process (or, with `path`, one thread) from /proc/PID/stat: one read, cheaper than psutil's several."""
    try:
        fd = os.open(path or f"/proc/{pid}/stat", os.O_RDONLY)  # os.read: half the CPU of a buffered open
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        return None
    close = raw.rfind(b")")
    f = raw[close + 2 :].split()  # fields from the third (state) on
    try:
        return Proc(pid, raw[raw.find(b"(") + 1 : close].decode(errors="replace"), int(f[1]), int(f[11]) + int(f[12]),
                    int(f[19]), int(f[36]), int(f[17]))  # fmt: skip
    except (IndexError, ValueError):
        return None


def snapshot() -> dict[int, Proc]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            p = read_proc(int(entry))
            if p is not None:
                out[p.pid] = p
    return out


def descendants(procs: Mapping[int, Proc], root: int) -> set[int]:
    """`root` and every process below it (by parent id, in one snapshot)."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    seen, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return seen


def _environ_token(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(TOKEN_VAR.encode() + b"="):
                    return item.split(b"=", 1)[1].decode(errors="replace")
    except OSError:  # gone, or another user's process: not ours
        return None
    return None


def _thread_cores(pid: int) -> list[int]:
    """The core each thread of a process last ran on: a multi-threaded process's CPU is spread over them."""
    cores: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return cores
    for tid in tids:
        t = read_proc(int(tid), f"/proc/{pid}/task/{tid}/stat")
        if t is not None:
            cores.append(t.core)
    return cores


def _affinity(pid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(pid))
    except OSError:
        return None


class GpuWatch:
    """NVML processes on the watched GPUs; without the library or a driver, `query` says why and nothing is read."""

    def __init__(self, devices: list[int] | None) -> None:
        self.query = "ok"
        self.indices: list[int] = []
        self._lib: Any = None
        self._handles: list[tuple[int, Any]] = []
        if devices is not None and not devices:
            self.query = "CPU package: no GPU watched"
            return
        try:
            lib = gpu_library()
            lib_call(lib, "Init")
        except Exception as exc:  # no library, no driver: a CPU host
            self.query = f"no NVML ({type(exc).__name__})"
            return
        self._lib = lib
        try:
            count = lib_call(lib, "DeviceGetCount")
            self.indices = [i for i in (range(count) if devices is None else devices) if i < count]
            self._handles = [(i, lib_call(lib, "DeviceGetHandleByIndex", i)) for i in self.indices]
        except lib.NVMLError as exc:
            self.query = f"NVML error ({exc})"

    def pids(self) -> list[tuple[int, int]]:
        """(GPU index, pid) of every compute and graphics process on the watched GPUs now."""
        out: list[tuple[int, int]] = []
        if self._lib is None:
            return out
        for index, handle in self._handles:
            for getter in ("DeviceGetComputeRunningProcesses", "DeviceGetGraphicsRunningProcesses"):
                try:
                    out += [(index, int(p.pid)) for p in lib_call(self._lib, getter, handle)]
                except Exception as exc:
                    self.query = f"NVML error ({exc})"
        return sorted(set(out))

    def util_sampler(self) -> UtilSampler | None:
        """How busy the watched GPUs were (orchestrator.run.gpu_busy); None without NVML."""
        return None if self._lib is None else UtilSampler(self._lib, self._handles)

    def close(self) -> None:
        if self._lib is not None:
            try:
                lib_call(self._lib, "Shutdown")
            except Exception:
                pass


class HostWatcher:
    """`start()` as the train package starts, `finish(package_dir)` once it ended: the samples as evidence.

    `root`: the process whose descendants are the package's (orch itself: it runs one package at a time).
    `devices`: NVML indices of the package's GPUs; [] for a CPU package; None: every GPU.
    """

    def __init__(self, package_dir: Path, devices: list[int] | None, interval_s: float = INTERVAL_S,
                 root: int | None = None) -> None:  # fmt: skip
        self.package_dir = package_dir
        self.devices = devices
        self.interval_s = interval_s
        self.root = os.getpid() if root is None else root
        self.samples: list[WatchSample] = []
        self.cpu_query = "ok" if os.path.isdir("/proc/self") else "no /proc: CPU not watched"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="host-watch", daemon=True)
        self._last: dict[tuple[int, int], int] = {}  # (pid, start) -> cpu ticks at the previous sample
        self._token: str | None = None
        self._tokens: dict[tuple[int, int], bool] = {}  # non-descendant (pid, start) -> carries the token
        self._steps_offset = 0
        self._steps_done = 0
        self._t0 = 0.0
        self._cpu_s = 0.0
        self._wall = 0.0
        self._cpus = sorted(_affinity(0) or range(os.cpu_count() or 1))
        self._gpu: GpuWatch | None = None
        self._util: UtilSampler | None = None

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._thread.start()

    def _loop(self) -> None:
        c0 = time.thread_time()
        self._gpu = GpuWatch(self.devices)
        self._util = self._gpu.util_sampler()
        try:
            while True:
                self._sample()
                if self._stop.wait(self.interval_s):
                    self._sample()  # the last interval, up to the package's end
                    break
        finally:
            self._gpu.close()
            self._cpu_s = time.thread_time() - c0

    def finish(self) -> HostWatchRef:
        """Stop sampling, write host_watch.json (read-only) into the package directory; its reference for run.json."""
        self._stop.set()
        self._thread.join()
        self._wall = time.monotonic() - self._t0
        log = self.log()
        path = self.package_dir / HOST_WATCH_FILE
        self.package_dir.mkdir(parents=True, exist_ok=True)
        if path.is_symlink() or path.is_file():  # a package's file of that name is not orch's evidence
            path.unlink()
        elif path.exists():
            shutil.rmtree(path, ignore_errors=True)
        write_atomic(path, canonical_json(log.model_dump(mode="json", by_alias=True), ensure_ascii=True).encode())
        path.chmod(0o444)
        return HostWatchRef(file=HOST_WATCH_FILE, sha256=sha256_file(path), samples=len(log.samples),
                            sampler_cpu_s=round(log.sampler_cpu_s, 4))

    def log(self) -> HostWatchLog:
        gpu = self._gpu
        return HostWatchLog(
            interval_s=self.interval_s, cpus=self._cpus, gpus=[] if gpu is None else gpu.indices,
            gpu_query="not started" if gpu is None else gpu.query, cpu_query=self.cpu_query,
            gpu_util_query=self._util.query if self._util is not None else "not started" if gpu is None else gpu.query,
            wall_s=round(self._wall, 4), sampler_cpu_s=round(self._cpu_s, 4), samples=self.samples,
        )  # fmt: skip

    def _read_steps(self) -> int:
        """Lines of rank 0's step file so far (read incrementally): the probe writes one after each step."""
        try:  # the package may have put a FIFO or a link there: never followed, never waited on (issue 49)
            fd = os.open(self.package_dir / "steps.rank0.jsonl", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return self._steps_done
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return self._steps_done
            chunk = os.pread(fd, 1 << 24, self._steps_offset)
        except OSError:
            return self._steps_done
        finally:
            os.close(fd)
        self._steps_offset += len(chunk)
        self._steps_done += chunk.count(b"\n")
        return self._steps_done

    def _sample(self) -> None:
        t = round(time.monotonic() - self._t0, 4)
        steps = self._read_steps()
        util = self._util.read() if self._util is not None else []
        if self.cpu_query != "ok":
            self.samples.append(WatchSample(t_s=t, steps_done=steps, gpu_util=util))
            return
        procs = snapshot()
        own = descendants(procs, self.root)
        blocks = self._blocks(own)
        ranks = set().union(*blocks) if blocks else set(self._cpus)
        foreign_s: dict[int, float] = {}
        other = 0.0
        busy: dict[str, float] = {}
        for p, used in self.observe(procs, own).values():
            name = public_name(p.name)
            busy[name] = busy.get(name, 0.0) + used
            for core, share in self._cores_of(p, used).items():
                if core in ranks:
                    foreign_s[core] = foreign_s.get(core, 0.0) + share
                else:
                    other += share
        top = sorted(busy.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]
        gpus, unresolved = self._gpu_foreign(procs, own)
        self.samples.append(WatchSample(
            t_s=t, steps_done=steps, foreign_s={str(c): round(s, 4) for c, s in sorted(foreign_s.items())},
            other_s=round(other, 4), blocks=[sorted(b) for b in blocks],
            top=[WatchBusy(name=n, cpu_s=round(x, 3)) for n, x in top], gpu_foreign=gpus, gpu_unresolved=unresolved,
            gpu_util=util,
        ))  # fmt: skip

    def observe(self, procs: Mapping[int, Proc], own: set[int]) -> dict[int, tuple[Proc, float]]:
        """pid -> (process, CPU seconds since the previous call) of every foreign process that used CPU; the first
        call only sets the base. `own`: orch and its descendants; a process carrying the package's token is ours."""
        if self._token is None:  # the package's token, from the environment of orch's first child that carries one
            self._token = next((tok for pid in sorted(own - {self.root}) if (tok := _environ_token(pid))), None)
        last, self._last = self._last, {}
        for p in procs.values():
            self._last[(p.pid, p.start)] = p.cpu_ticks
        if not last:
            return {}
        out = {}
        for p in procs.values():
            if p.pid in own:
                continue
            used = (p.cpu_ticks - last.get((p.pid, p.start), 0)) / _TICK  # born since the last call: all of it
            if used > 0 and not self._carries_token(p):
                out[p.pid] = (p, used)
        return out

    def _carries_token(self, p: Proc) -> bool:
        if self._token is None:
            return False
        key = (p.pid, p.start)
        if key not in self._tokens:
            self._tokens[key] = _environ_token(p.pid) == self._token
        return self._tokens[key]

    def _blocks(self, own: set[int]) -> list[frozenset[int]]:
        """The distinct core sets of the package's pinned processes (the ranks with pin_cpus); [] when none is."""
        full = frozenset(self._cpus)
        found = set()
        for pid in own - {self.root}:
            aff = _affinity(pid)
            if aff is not None and aff < full:
                found.add(aff)
        return sorted(found, key=lambda b: sorted(b))

    def _cores_of(self, p: Proc, used: float) -> dict[int, float]:
        """The process's CPU seconds by the core it ran on: its threads' last cores, or its own."""
        if p.threads <= 1:
            return {p.core: used}
        cores = _thread_cores(p.pid) or [p.core]
        return {c: used * cores.count(c) / len(cores) for c in set(cores)}

    def _gpu_foreign(self, procs: Mapping[int, Proc], own: set[int]) -> tuple[list[WatchGpu], int]:
        if self._gpu is None:
            return [], 0
        found, unresolved = [], 0
        for index, pid in self._gpu.pids():
            p = procs.get(pid)
            if p is None:
                unresolved += 1
            elif pid not in own and not self._carries_token(p):
                found.append(WatchGpu(index=index, name=public_name(p.name)))
        return sorted(set(found), key=lambda g: (g.index, g.name)), unresolved


def package_devices(device: str, env: Mapping[str, str]) -> list[int] | None:
    """The NVML indices of a package's GPUs: [] for a CPU package; from CUDA_VISIBLE_DEVICES when it lists
    indices; None (every GPU) otherwise."""
    if device != "cuda":
        return []
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    parts = [x.strip() for x in raw.split(",") if x.strip()]
    return [int(x) for x in parts] if parts and all(x.isdigit() for x in parts) else None
