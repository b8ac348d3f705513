"""Benchmark of r3-mini: fresh baseline A -> candidate -> baseline B launches under the probe (16 steps), step
time per arm and the candidate speedup on the timed windows; prints a table, writes the figures as JSON.

Usage: `python bench/bench_r3mini.py [--device cpu|cuda] [--nproc N] [--out .orch/bench/r3mini.json] [-- ARGS]`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from protocol.recipe import recipe_flags  # noqa: E402

SOURCE = REPO / "examples" / "r3_mini"
SWITCHES = ("CUDA_GRAPH", "ROLLOUT_UNSHARD", "VIT_CACHE", "REF_GATHER_ONCE", "TRITON_TOPK")
RECIPE = [*recipe_flags(), "--debug", "True"]  # the frozen recipe; --debug skips the step-0 evaluation
STEPS, WARMUP, WINDOW = 16, 10, 2


def run_arm(code: Path, work: Path, name: str, switch: str, device: str, nproc: int, extra: list[str]) -> dict:
    """One fresh launch; returns per-step times (max over ranks) and the wall time of the whole launch."""
    out = work / name
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_FUSE_")}
    env.update({f"R3_FUSE_{s}": switch for s in SWITCHES})
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
        "-m", "workers.probe", "--out", str(out / "probe"), "--steps", str(STEPS), "--ckpt-dir", str(out / "ckpt"),
        "--", "train/online_rl.py", *RECIPE, "--device", device,
        "--resume_from", str(work / "init.safetensors"), *extra,
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    per_rank = []
    for rank in range(nproc):
        lines = (out / "probe" / f"steps.rank{rank}.jsonl").read_text().splitlines()
        per_rank.append({r["step"]: r for r in map(json.loads, lines)})
    steps = [max(rank[s]["duration_s"] for rank in per_rank) for s in range(STEPS)]
    finals = [json.loads((out / "probe" / f"probe.rank{r}.json").read_text())["final_combined"] for r in range(nproc)]
    shutil.rmtree(out / "ckpt", ignore_errors=True)  # checkpoints never outlive the bench
    return {"steps_s": steps, "wall_s": wall, "final_digests": finals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--nproc", type=int, default=None, help="ranks (default: 2 on cpu, 1 on cuda)")
    parser.add_argument("--out", default=str(REPO / ".orch" / "bench" / "r3mini.json"))
    parser.add_argument("extra", nargs="*", help="extra trainer flags after --")
    args = parser.parse_args()
    device = args.device
    if device is None:
        try:
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        except ImportError:
            device = "cpu"
    nproc = args.nproc or (1 if device == "cuda" else 2)
    with tempfile.TemporaryDirectory(prefix="r3mini-bench-") as tmp:
        work = Path(tmp)
        code = work / "sealed"
        shutil.copytree(SOURCE, code, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(
            [sys.executable, "train/make_init.py", "--out", str(work / "init.safetensors"), "--seed", "1", *args.extra],
            cwd=code, check=True,
        )  # fmt: skip
        arms = {}
        for name, switch in (("baseline_A", "0"), ("candidate", "1"), ("baseline_B", "0")):
            arms[name] = run_arm(code, work, name, switch, device, nproc, args.extra)
    windows = [(s, s + WINDOW - 1) for s in range(WARMUP, STEPS, WINDOW)]

    def window_time(arm: str, w: tuple[int, int]) -> float:
        return sum(arms[arm]["steps_s"][w[0] : w[1] + 1])

    ratios, drifts = [], []
    for w in windows:
        a, b, c = window_time("baseline_A", w), window_time("baseline_B", w), window_time("candidate", w)
        ratios.append(((a + b) / 2) / c)
        drifts.append(abs(a - b) / ((a + b) / 2))
    medians = {name: statistics.median(arm["steps_s"][WARMUP:]) for name, arm in arms.items()}
    identical = (
        arms["baseline_A"]["final_digests"] == arms["candidate"]["final_digests"] == arms["baseline_B"]["final_digests"]
    )
    figures = {
        "schema": "r3mini.bench/1",
        "device": device,
        "nproc": nproc,
        "extra_flags": args.extra,
        "median_step_s": medians,
        "wall_s": {name: arm["wall_s"] for name, arm in arms.items()},
        "window_ratios": ratios,
        "window_drifts": drifts,
        "speedup_min_window": min(ratios),
        "speedup_median_step": statistics.mean([medians["baseline_A"], medians["baseline_B"]]) / medians["candidate"],
        "final_digests_identical": identical,
        "steps_s": {name: arm["steps_s"] for name, arm in arms.items()},
    }
    print(f"r3-mini bench: device={device} nproc={nproc} steps={STEPS} (timed steps {WARMUP}-{STEPS - 1})")
    print(f"{'arm':<12} {'median step [ms]':>17} {'launch wall [s]':>16}")
    for name in arms:
        print(f"{name:<12} {medians[name] * 1000:>17.2f} {arms[name]['wall_s']:>16.2f}")
    print(f"speedup (baseline mean / candidate, median step): {figures['speedup_median_step']:.3f}x")
    print(f"window ratios: {', '.join(f'{r:.3f}' for r in ratios)}  (min {min(ratios):.3f}x)")
    print(f"A/B drift per window: {', '.join(f'{d:.3f}' for d in drifts)}")
    print(f"final parameter/Adam digests identical across arms: {identical}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    print(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
