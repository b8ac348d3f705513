"""Benchmark of the TRL GRPO candidate without orch: TRL's default (gradient checkpointing on) against
`--gradient_checkpointing False`, each run being the user's own script (examples/trl_grpo/train_grpo.py) under
torchrun with the recipe's flags, on 2 CPU ranks (default) or on one GPU (`--device cuda`: bf16 autocast,
`--full_determinism`, cuBLAS's deterministic workspace, as protocol/trl_grpo_cuda1.yaml runs it).

Each run's step times come from a TrainerCallback (perf_counter around each optimizer step, rank 0) added by
wrapping GRPOTrainer.__init__ from outside the script; the time of GRPOTrainer._generate_and_score_completions
(generation, rewards, the reference model's forward) is taken the same way, so that a step splits into generation
and training. On CUDA the device is synchronized at those marks. The figure per run is the median of steps 10-15
(the owner's measured windows); on CUDA also the GPU-busy share of those steps (NVML sampled from the bench's own
process, as orch's host watch samples it; the device syncs at the step marks cost a little of it). Runs alternate
on, off, on, off...; per size the table gives each arm's median over runs, the spread of the run medians between
fresh launches (CV: what `orch calibrate` measures between A/A launches), the GPU-busy share,
the generation share of a step, and the ratio on/off (> 1: the candidate is faster).

Why sizes: on one H100 the shipped GPU recipe (16 layers x 1536, 256 completions of 16 tokens) gave A/A launches
whose step times differed by up to 1.8x (docs/validation/trl_grpo_h100x1_calibration.json); a size fit for a verdict
has a small CV between launches and a candidate saving well beyond it. Needs the `trl` extra (`make bench-trl`
installs it).

Usage: python bench/bench_trl_gc.py [--runs 3] [--size LAYERSxHIDDENxBATCH ...] [--device cuda]
       [--determinism full|algorithms] [--profile] [--out FILE]
--profile: step 8 of each run (before the timed ones) under torch.profiler; its aggregate (top operators by self CPU
and by self device time, and their totals) is printed and kept in the JSON: a summary, never a trace.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # orch's NVML sampler and GPU-busy reader (the bench's own folder is already there)
    sys.path.insert(0, str(REPO))
SCRIPT = REPO / "examples" / "trl_grpo"
MEASURED = slice(10, 16)  # steps 10-15: the protocol's three timed windows of 2

# run as the torchrun entry point: the user's script with timing callbacks added from outside
TIMED = """
import json, os, runpy, sys, time
import torch
import trl
from transformers import TrainerCallback

CUDA = os.environ.get("BENCH_DEVICE") == "cuda"
steps, gens = [], []
if os.environ.get("BENCH_DETERMINISM") == "algorithms":  # the deterministic kernels without enable_full_determinism
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False

def now():
    if CUDA:
        torch.cuda.synchronize()
    return time.perf_counter()

PROFILE = os.environ.get("BENCH_PROFILE")  # a JSON file: the profiled step's aggregate (rank 0)
PROFILED = 8  # the ninth step: after warm-up compiles, before the timed steps 10-15
prof = None

def profile_summary(p, top=15):
    rows = p.key_averages()
    def device_us(e):
        return getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0))
    def entry(e):
        return {"name": e.key, "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "self_device_ms": device_us(e) / 1e3}
    return {"step": PROFILED, "self_cpu_ms_total": sum(e.self_cpu_time_total for e in rows) / 1e3,
            "self_device_ms_total": sum(device_us(e) for e in rows) / 1e3,
            "by_cpu": [entry(e) for e in sorted(rows, key=lambda e: -e.self_cpu_time_total)[:top]],
            "by_device": [entry(e) for e in sorted(rows, key=lambda e: -device_us(e))[:top] if device_us(e) > 0]}

class StepTimer(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        global prof
        if PROFILE and len(steps) == PROFILED and os.environ.get("RANK", "0") == "0":
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if CUDA else [])
            prof = torch.profiler.profile(activities=acts)
            prof.__enter__()
        self.t0 = now()
        gens.append(0.0)

    def on_step_end(self, args, state, control, **kwargs):
        global prof
        steps.append(now() - self.t0)
        if prof is not None:
            prof.__exit__(None, None, None)
            with open(PROFILE, "w") as f:
                json.dump({**profile_summary(prof), "step_s": steps[-1]}, f)
            prof = None
        if os.environ.get("RANK", "0") == "0":
            with open(os.environ["BENCH_PROGRESS"], "a") as f:
                f.write("%d\\n" % len(steps))

init = trl.GRPOTrainer.__init__
generate = trl.GRPOTrainer._generate_and_score_completions

def timed_init(self, *args, **kwargs):
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StepTimer()]
    init(self, *args, **kwargs)

def timed_generate(self, *args, **kwargs):
    t0 = now()
    out = generate(self, *args, **kwargs)
    if gens:
        gens[-1] += now() - t0
    return out

trl.GRPOTrainer.__init__ = timed_init
trl.GRPOTrainer._generate_and_score_completions = timed_generate
sys.path.insert(0, os.getcwd())
sys.argv = ["train_grpo.py", *sys.argv[1:]]
runpy.run_path("train_grpo.py", run_name="__main__")
if os.environ.get("RANK", "0") == "0":
    with open(os.environ["BENCH_TIMES"], "w") as f:
        json.dump({"steps": steps, "generation": gens}, f)
"""


@dataclass(frozen=True)
class Size:
    layers: int
    hidden: int
    batch: int  # completions a device a step (per_device_train_batch_size)

    @classmethod
    def parse(cls, text: str) -> Size:
        try:
            layers, hidden, batch = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"size {text!r}: write LAYERSxHIDDENxBATCH, e.g. 16x1536x256") from None
        return cls(layers, hidden, batch)

    def __str__(self) -> str:
        return f"{self.layers}x{self.hidden}x{self.batch}"


@dataclass(frozen=True)
class Run:
    step_s: float  # median of steps 10-15
    generation_s: float  # median over the same steps of the time in generation and scoring
    gpu_busy: float | None = None  # share of steps 10-15 the GPU was busy (NVML, outside the ranks); None on CPU
    profile: dict[str, Any] | None = None  # --profile: torch.profiler's aggregate of step PROFILED (before 10-15)


def command(wrapper: Path, out: Path, gc: bool, size: Size, opts: argparse.Namespace) -> list[str]:
    """torchrun of the user's script with the recipe's flags (recipes/trl_grpo_tiny.yaml on CPU,
    recipes/trl_grpo_cuda.yaml on CUDA), at `size`."""
    cuda = opts.device == "cuda"
    full = "True" if opts.determinism == "full" else "False"
    device = (["--bf16", "True", "--full_determinism", full] if cuda
              else ["--bf16", "False", "--use_cpu", "True"])
    return [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(opts.nproc), str(wrapper),
        "--output_dir", str(out), *device, "--report_to", "none", "--save_strategy", "no", "--logging_steps", "1",
        "--disable_tqdm", "True", "--max_steps", "16", "--learning_rate", "1e-5", "--warmup_steps", "10",
        "--beta", "0.04", "--num_generations", str(opts.num_generations),
        "--per_device_train_batch_size", str(size.batch), "--max_completion_length", str(opts.completion_length),
        "--seed", "42", "--layers", str(size.layers), "--hidden_size", str(size.hidden),
        "--gradient_checkpointing", str(gc),
    ]  # fmt: skip


def one_run(work: Path, gc: bool, size: Size, opts: argparse.Namespace, n: int) -> Run:
    """Medians over steps 10-15 of one torchrun of the user's script."""
    times = work / f"times{n}.json"
    wrapper = work / "timed.py"
    wrapper.write_text(TIMED)
    env = {**os.environ, "BENCH_TIMES": str(times), "BENCH_DEVICE": opts.device, "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if opts.device == "cuda":
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    progress = work / f"progress{n}.txt"
    env["BENCH_PROGRESS"] = str(progress)
    env["BENCH_DETERMINISM"] = opts.determinism
    profiled = work / f"profile{n}.json"
    if opts.profile:
        env["BENCH_PROFILE"] = str(profiled)
    cmd = command(wrapper, work / f"out{n}", gc, size, opts)
    code, stderr, busy = _sampled(cmd, env, progress, opts.device)
    if not times.is_file():
        raise SystemExit(f"run {n} ({size}, gradient_checkpointing={gc}) failed, exit {code}:\n{stderr[-3000:]}")
    got = json.loads(times.read_text())
    if len(got["steps"]) < MEASURED.stop:
        raise SystemExit(f"run {n} ({size}) recorded {len(got['steps'])} steps, fewer than {MEASURED.stop}")
    profile = json.loads(profiled.read_text()) if opts.profile and profiled.is_file() else None
    return Run(statistics.median(got["steps"][MEASURED]), statistics.median(got["generation"][MEASURED]), busy,
               profile)


def _sampled(cmd: list[str], env: dict[str, str], progress: Path, device: str,
             interval: float = 0.1) -> tuple[int, str, float | None]:  # fmt: skip
    """Run `cmd` to its end while the GPU's utilisation is sampled from here (NVML, as orch's host watch reads it),
    each sample tagged with the steps rank 0 had finished; (exit code, stderr, GPU-busy of steps 10-15)."""
    from bench_floor import Sampler

    from ledger.verdict.decide.gpu_busy import launch_busy
    from orchestrator.run.gpu_busy import UtilSampler
    from protocol.host.quiet_host import WatchSample

    sampler = Sampler(device)
    util = UtilSampler(sampler.lib, sampler.handles) if sampler.lib is not None else None
    samples: list[WatchSample] = []
    t0 = time.monotonic()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=SCRIPT, env=env, stdout=subprocess.DEVNULL, stderr=err)
        while proc.poll() is None and time.monotonic() - t0 < 900:
            done = progress.read_bytes().count(b"\n") if progress.is_file() else 0
            samples.append(WatchSample(t_s=round(time.monotonic() - t0, 4), steps_done=done,
                                       gpu_util=util.read() if util is not None else []))  # fmt: skip
            time.sleep(interval)
        if proc.poll() is None:
            proc.kill()
        code = proc.wait()
        err.seek(0)
        stderr = err.read().decode(errors="replace")
    log = sampler.log(samples, interval)
    busy = None if log is None else launch_busy(log, MEASURED.stop, MEASURED.start, 2)["timed"]
    return code, stderr, busy


def profile_lines(profile: dict[str, Any] | None, top: int = 6) -> list[str]:
    """The profiled step in a few lines: its time, the operators' self CPU and self device totals, the top of each."""
    if profile is None:
        return []
    lines = [f"profiled step {profile['step']}: {profile['step_s']:.4f} s; self CPU {profile['self_cpu_ms_total']:.1f}"
             f" ms, self device {profile['self_device_ms_total']:.1f} ms (operators and kernels summed)"]
    for key, label in (("by_cpu", "self CPU"), ("by_device", "self device")):
        for e in profile[key][:top]:
            ms = e["self_cpu_ms"] if key == "by_cpu" else e["self_device_ms"]
            lines.append(f"{label} {ms:9.2f} ms x{e['count']:<6} {e['name'][:90]}")
    return lines


def cv(values: list[float]) -> float:
    """Spread of fresh launches' medians: sample SD over mean (0 for one run)."""
    return statistics.stdev(values) / statistics.mean(values) if len(values) > 1 else 0.0


def summary(size: Size, runs: dict[str, list[Run]]) -> dict[str, Any]:
    """One size's figures: per arm the run medians, their median and CV, the generation share; the ratio on/off."""
    row: dict[str, Any] = {"size": str(size), "layers": size.layers, "hidden_size": size.hidden,
                           "batch": size.batch}
    for arm, arm_runs in runs.items():
        steps = [r.step_s for r in arm_runs]
        busy = [r.gpu_busy for r in arm_runs if r.gpu_busy is not None]
        row[arm] = {"s_per_step": steps, "median": statistics.median(steps), "cv": cv(steps),
                    "generation_share": statistics.median(r.generation_s / r.step_s for r in arm_runs),
                    "gpu_busy": busy, "gpu_busy_median": statistics.median(busy) if busy else None}
        row[arm]["profiles"] = [r.profile for r in arm_runs if r.profile is not None]
    row["ratio_on_off"] = row["on"]["median"] / row["off"]["median"]
    row["every_off_faster"] = max(row["off"]["s_per_step"]) < min(row["on"]["s_per_step"])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per arm and size, alternated")
    ap.add_argument("--size", type=Size.parse, action="append", default=None,
                    help="LAYERSxHIDDENxBATCH, repeatable (default 4x512x16 on CPU, 16x1536x256 on CUDA)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--nproc", type=int, default=None, help="ranks (default 2 on CPU, 1 on CUDA)")
    ap.add_argument("--num-generations", type=int, default=None, help="default 4 on CPU, 8 on CUDA (the recipes')")
    ap.add_argument("--completion-length", type=int, default=16, help="max_completion_length")
    ap.add_argument("--determinism", choices=("full", "algorithms"), default="full",
                    help="full: the recipe's --full_determinism True (transformers' enable_full_determinism, which "
                         "also sets CUDA_LAUNCH_BLOCKING=1); algorithms: --full_determinism False and the timing "
                         "wrapper sets torch's deterministic algorithms itself: the same kernels, no such variable")
    ap.add_argument("--profile", action="store_true",
                    help="profile step 8 (before the timed 10-15) of each run with torch.profiler (CPU, and CUDA on a "
                         "GPU): its top operators by self CPU and self device time go to the table and the JSON")
    ap.add_argument("--out", type=Path, default=None, help="write the figures (JSON) here")
    opts = ap.parse_args()
    cuda = opts.device == "cuda"
    opts.nproc = opts.nproc or (1 if cuda else 2)
    opts.num_generations = opts.num_generations or (8 if cuda else 4)
    sizes = opts.size or [Size(16, 1536, 256) if cuda else Size(4, 512, 16)]
    rows = []
    numbers = itertools.count()  # each run's own times and output folder
    with tempfile.TemporaryDirectory(prefix="orch-bench-trl-") as tmp:
        for size in sizes:
            runs: dict[str, list[Run]] = {"on": [], "off": []}
            for i in range(opts.runs):
                for arm, gc in (("on", True), ("off", False)):
                    runs[arm].append(one_run(Path(tmp), gc, size, opts, next(numbers)))
                    got = runs[arm][-1]
                    busy = "" if got.gpu_busy is None else f", GPU-busy {got.gpu_busy:.0%}"
                    print(f"{size} run {i + 1} gradient checkpointing {arm}: {got.step_s:.4f} s/step "
                          f"(generation {got.generation_s:.4f} s{busy})", flush=True)
                    for line in profile_lines(got.profile):
                        print(f"  {line}", flush=True)
            rows.append(summary(size, runs))
    where = f"{opts.nproc} {'GPU' if cuda else 'CPU'} rank(s)"
    print(f"\nTRL GRPO on {where}, {opts.num_generations} generations of at most {opts.completion_length} tokens; "
          f"median s/step of steps 10-15, {opts.runs} fresh runs per arm, determinism {opts.determinism}")
    print("size (layers x hidden x completions) | arm | run medians s/step | median | CV between runs | generation "
          "| GPU-busy (steps 10-15)")
    for row in rows:
        for arm, label in (("on", "on (baseline)"), ("off", "off (candidate)")):
            a = row[arm]
            busy = "-" if a["gpu_busy_median"] is None else f"{a['gpu_busy_median']:.0%}"
            print(f"{row['size']} | {label} | {' / '.join(f'{x:.4f}' for x in a['s_per_step'])} | "
                  f"{a['median']:.4f} | {a['cv']:.1%} | {a['generation_share']:.0%} | {busy}")
        print(f"{row['size']} | ratio on/off {row['ratio_on_off']:.3f}x | every candidate run faster than every "
              f"baseline run: {row['every_off_faster']}")
    if opts.out is not None:
        opts.out.write_text(json.dumps({"device": opts.device, "nproc": opts.nproc, "runs": opts.runs,
                                        "num_generations": opts.num_generations,
                                        "completion_length": opts.completion_length,
                                        "determinism": opts.determinism, "sizes": rows},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
