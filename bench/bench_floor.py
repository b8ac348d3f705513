"""`make bench-floor`: orch's own launch-to-launch noise against the host's floor, in one call (issue 50). The same
workload (a protocol's baseline trainer) two ways: plain fresh launches with no orch (torchrun of the committed trainer,
stopped after its 16th step line, as ../shared/tools/launch_noise.py does for its toy step) and orch A/A triplets
(`orch calibrate`). Prints, for each, the SD of the paired d, the max A/B drift and the GPU-busy share of the timed
windows (NVML, sampled outside the ranks); writes the figures (JSON).

Usage: python bench/bench_floor.py [--device cpu|cuda] [--protocol NULL.yaml] [--plain-triplets 3]
       [--orch-triplets 3] [--small] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_null import SMALL, env, orch, project

from ledger.verdict.decide.gpu_busy import launch_busy
from protocol.host.quiet_host import HostWatchLog, WatchSample

REPO = Path(__file__).resolve().parents[1]
STEPS, WARMUP, WINDOW = 16, 10, 2
WINDOWS = [(a, a + WINDOW) for a in range(WARMUP, STEPS, WINDOW)]
BOUND_NULL = "r3_mini_cuda1_bound_null.yaml"
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def protocol_copy(proj: Path, name: str, small: bool, repeats: int = 1) -> Path:
    """A shipped protocol in the bench project, both arms from its git HEAD; --small: shorter rollouts."""
    data = yaml.safe_load((REPO / "protocol" / name).read_text())
    for arm in ("baseline", "candidate"):
        data["arms"][arm]["source"] = {"git": "HEAD"}
    data["measurement"]["repeats"] = repeats
    if small:
        data["launcher"]["args"] += SMALL
        data["scorer"]["command"] += SMALL
    path = proj / "protocol" / f"{Path(name).stem}_k{repeats}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _substitute(items: list[str], values: dict[str, str]) -> list[str]:
    out = []
    for item in items:
        for key, value in values.items():
            item = item.replace("{" + key + "}", value)
        if "{" in item and "}" in item:
            raise SystemExit(f"bench-floor: argument {item!r} has a placeholder this bench does not fill")
        out.append(item)
    return out


class Sampler:
    """GPU-busy of a plain launch, read as the host watch reads it (NVML outside the ranks, per interval), mapped to
    steps by the trainer's own step lines; None without NVML (a CPU host)."""

    def __init__(self, device: str) -> None:
        self.lib: Any = None
        self.handles: list[tuple[int, Any]] = []
        if device != "cuda":
            return
        try:
            from protocol.host.gpu_library import gpu_library, lib_call

            self.lib = gpu_library()
            lib_call(self.lib, "Init")
            self.handles = [(0, lib_call(self.lib, "DeviceGetHandleByIndex", 0))]
        except Exception as exc:
            print(f"bench-floor: GPU-busy not read ({type(exc).__name__})", file=sys.stderr)
            self.lib = None

    def log(self, samples: list[WatchSample], interval: float) -> HostWatchLog | None:
        if self.lib is None:
            return None
        return HostWatchLog(interval_s=interval, cpus=[], gpus=[i for i, _ in self.handles], gpu_query="ok",
                            cpu_query="not read", gpu_util_query="ok", wall_s=samples[-1].t_s if samples else 0.0,
                            sampler_cpu_s=0.0, samples=samples)  # fmt: skip


def plain_launch(proj: Path, protocol: Path, init: Path, work: Path, sampler: Sampler,
                 interval: float = 0.1) -> dict[str, Any]:  # fmt: skip
    """One fresh launch of the protocol's baseline trainer with no orch: torchrun in the committed tree, stopped
    (its process group) once rank 0 has logged its 16th step. Step times are the trainer's own (device-synced)."""
    from orchestrator.run.gpu_busy import UtilSampler

    p = yaml.safe_load(protocol.read_text())
    launcher = p["launcher"]
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    args = _substitute([str(a) for a in launcher["args"]], {"package_dir": str(work), "init": str(init)})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(launcher.get("nproc", 1)), launcher["script"], *args]  # fmt: skip
    child_env = {**env(), **{k: str(v) for k, v in (launcher.get("env") or {}).items()},
                 **{k: str(v) for k, v in p["arms"]["baseline"]["switches"].items()}, **NO_MULTICAST}  # fmt: skip
    lines_path = work / "trainer" / "train.jsonl"
    util = UtilSampler(sampler.lib, sampler.handles) if sampler.lib is not None else None
    samples: list[WatchSample] = []
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=proj / p["sources"]["root"], env=child_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
    done = 0
    try:
        while proc.poll() is None:
            done = lines_path.read_bytes().count(b"\n") if lines_path.is_file() else 0
            samples.append(WatchSample(t_s=round(time.monotonic() - t0, 4), steps_done=done,
                                       gpu_util=util.read() if util is not None else []))  # fmt: skip
            if done >= STEPS:
                break
            time.sleep(interval)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    records = [json.loads(x) for x in lines_path.read_text().splitlines()] if lines_path.is_file() else []
    times = [float(r["step_time"]) for r in records[:STEPS]]
    if len(times) < STEPS:
        raise SystemExit(f"bench-floor: the plain launch logged {len(times)} of {STEPS} steps: {err[-1500:]}")
    log = sampler.log(samples, interval)
    busy = None if log is None else launch_busy(log, STEPS, WARMUP, WINDOW)
    return {"times": times, "windows_s": [math.fsum(times[a:b]) for a, b in WINDOWS],
            "wall_s": round(time.monotonic() - t0, 1), "gpu_busy": None if busy is None else busy["timed"]}  # fmt: skip


def triplet_figures(a: list[float], c: list[float], b: list[float]) -> dict[str, float]:
    """The owner's per-window ratio and drift (DESIGN.md section 5) and the paired log speedup d of one triplet."""
    ratios = [(a[i] + b[i]) / 2 / c[i] for i in range(len(a))]
    return {"d": math.fsum(math.log(r) for r in ratios) / len(ratios), "headline": min(ratios),
            "ab_drift": max(abs(a[i] - b[i]) / ((a[i] + b[i]) / 2) for i in range(len(a)))}  # fmt: skip


def summary(trips: list[dict[str, float]]) -> dict[str, Any]:
    ds = [t["d"] for t in trips]
    return {"triplets": len(trips), "d": ds, "d_sd": statistics.stdev(ds) if len(ds) > 1 else None,
            "max_ab_drift": max((t["ab_drift"] for t in trips), default=None)}  # fmt: skip


def plain_floor(proj: Path, protocol: Path, triplets: int, device: str, work: Path,
                deadline: float = math.inf, launch_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """TRIPLETS x (A, C, B) plain launches of identical code, back to back; no triplet starts that would end after the
    deadline (a launch takes as long as the longest so far, or `launch_s` before the first)."""
    p = yaml.safe_load(protocol.read_text())
    init = work / "init.safetensors"
    prepare = p["checks"]["prepare"][0]["command"]
    made = subprocess.run(_substitute([sys.executable if x == "python" else str(x) for x in prepare],
                                      {"init": str(init)}), cwd=proj / p["sources"]["root"], env=env(),
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        raise SystemExit(f"bench-floor: make_init failed: {made.stderr[-1500:]}")
    sampler = Sampler(device)
    launches: list[dict[str, Any]] = []
    trips: list[dict[str, float]] = []
    for t in range(triplets):
        longest = max((x["wall_s"] for x in launches), default=launch_s)
        if longest is not None and time.monotonic() + 3.5 * longest > deadline:
            print(f"bench-floor: plain launches stopped at {t} triplet(s): the deadline is near", flush=True)
            break
        row = []
        for arm in "ACB":
            res = plain_launch(proj, protocol, init, work / "launch", sampler)
            res.update(triplet=t, arm=arm)
            launches.append(res)
            row.append(res["windows_s"])
            busy = "-" if res["gpu_busy"] is None else f"{res['gpu_busy']:.0%}"
            print(f"plain {t} {arm}: windows ms {[round(x * 1000, 2) for x in res['windows_s']]}, GPU-busy {busy}, "
                  f"{res['wall_s']} s", flush=True)
        trips.append(triplet_figures(*row))
    return floor_doc(trips, launches)


def floor_doc(trips: list[dict[str, float]], launches: list[dict[str, Any]]) -> dict[str, Any]:
    """The floor's figures: the triplets' summary, each launch, and the mean GPU-busy of those that read it."""
    busy = [x["gpu_busy"] for x in launches if x["gpu_busy"] is not None]
    return {**summary(trips), "trips": trips, "launches": launches,
            "gpu_busy_mean": statistics.mean(busy) if busy else None}  # fmt: skip


def orch_aa(proj: Path, protocol: Path, triplets: int, home: Path,
            timeout_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    """`orch calibrate PROTOCOL --repeats TRIPLETS`: orch's A/A triplets of the same workload, read back from the
    recorded calibration and its run's audit (per-triplet d and drift). At `timeout_s` orch is interrupted (SIGINT:
    its orderly stop, the running package stopped and recorded), then killed 120 s later."""
    t0 = time.monotonic()
    proc = subprocess.Popen(orch("calibrate", str(protocol), "--repeats", str(triplets), "--json", "--home",
                                 str(home), "--lock-dir", str(home / "locks")), cwd=proj, env=env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        stderr += f"\nbench: orch calibrate interrupted at the deadline ({timeout_s:.0f} s)"
    wall = time.monotonic() - t0
    try:
        doc = json.loads(stdout.strip().splitlines()[0])
        cal = doc["calibration"]
        audits = [json.loads((home / "runs" / r / "audit.json").read_text()) for r in cal["run_ids"]]
    except (IndexError, ValueError, KeyError, TypeError, OSError):
        return {"exit_code": proc.returncode, "wall_s": round(wall, 1), "error": stderr[-2000:]}
    trips = []
    busy: list[float] = []
    for d, audit in zip(cal["log_speedups"], audits, strict=True):  # one A/A launch (a run of one triplet) each
        t = audit["replication"]["triplets"][0]
        trips.append({"d": d, "ab_drift": t["max_drift"], "headline": t["headline"]})
        if (audit.get("gpu_busy") or {}).get("timed_busy") is not None:
            busy.append(audit["gpu_busy"]["timed_busy"])
    last = audits[-1]
    return {**summary(trips), "trips": trips, "exit_code": proc.returncode, "wall_s": round(wall, 1),
            "run_ids": cal["run_ids"], "calibration": cal, "gpu_busy_mean": statistics.mean(busy) if busy else None,
            "gpu_busy_words": (last.get("gpu_busy") or {}).get("words"),
            "host_watch_words": (last.get("host_watch") or {}).get("words")}  # fmt: skip


def table(plain: dict[str, Any], aa: dict[str, Any]) -> str:
    def f(x: float | None, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    rows = ["way | triplets | SD of paired d | max A/B drift | GPU-busy (timed windows)"]
    for name, r in (("plain launches (no orch)", plain), ("orch A/A (calibrate)", aa)):
        rows.append(f"{name} | {r.get('triplets', 0)} | {f(r.get('d_sd'), '.5f')} | {f(r.get('max_ab_drift'), '.4f')}"
                    f" | {f(r.get('gpu_busy_mean'), '.1%')}")
    if plain.get("d_sd") and aa.get("d_sd"):
        rows.append(f"orch / floor SD ratio: {aa['d_sd'] / plain['d_sd']:.2f} (goal <= 2)")
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--protocol", default=None, help=f"a null protocol in protocol/ (default: cuda {BOUND_NULL}, "
                    "cpu r3_mini_null.yaml)")  # fmt: skip
    ap.add_argument("--plain-triplets", type=int, default=3)
    ap.add_argument("--orch-triplets", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="shorter rollouts (a CPU dry run)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".orch/bench")) / "bench_floor.json")
    opts = ap.parse_args()
    name = opts.protocol or (BOUND_NULL if opts.device == "cuda" else "r3_mini_null.yaml")
    with tempfile.TemporaryDirectory(prefix="orch-floor-") as tmp:
        proj = project(Path(tmp))
        for extra in (name,):
            shutil.copy(REPO / "protocol" / extra, proj / "protocol" / extra)
        protocol = protocol_copy(proj, name, opts.small)
        plain = plain_floor(proj, protocol, opts.plain_triplets, opts.device, Path(tmp) / "plain")
        aa = orch_aa(proj, protocol, opts.orch_triplets, Path(tmp) / "home")
    figures = {"protocol": name, "device": opts.device, "small": opts.small, "plain": plain, "orch": aa}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(figures, indent=1) + "\n")
    print(table(plain, aa))
    print(f"figures: {opts.out}")
    return 0 if aa.get("exit_code") in (0, 1) and "error" not in aa else 1


if __name__ == "__main__":
    sys.exit(main())
