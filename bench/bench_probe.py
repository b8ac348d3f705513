"""Probe overhead on r3-mini: the trainer's own step times (steps 10-15) bare, under the probe without digests,
and under the probe with digests; the same instrument in all three, so the ratio is the probe's cost.

Usage: `python bench/bench_probe.py [--device cpu|cuda] [--nproc N] [--reps 2] [--out .orch/bench/probe.json]`.
Goals (issue 4): <= 1% without digests, <= 3% with digests on CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from bench_r3mini import RECIPE  # noqa: E402  (the recipe flags of the shipped protocols)

STEPS, FIRST_TIMED = 16, 10
PYPATH = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])  # keep the image's extras
CONFIGS = ("bare", "probe, no digests", "probe, digests 0-13")


def _trainer_steps(log: Path) -> list[float]:
    if not log.exists():
        return []
    return [json.loads(line)["step_time"] for line in log.read_text().splitlines() if line.strip()]


def run_once(config: str, code: Path, work: Path, device: str, nproc: int, init: Path) -> list[float]:
    """One fresh launch; the trainer's logged step_time of each step (rank 0)."""
    out = work / config.replace(" ", "_").replace(",", "")
    shutil.rmtree(out, ignore_errors=True)
    log_dir = out / "trainer"
    env = {k: v for k, v in os.environ.items() if not k.startswith("R3_FUSE_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=PYPATH, PYTHONDONTWRITEBYTECODE="1")
    args = [*RECIPE, "--log_dir", str(log_dir), "--resume_from", str(init), "--device", device,
            "--precision", "bf16" if device == "cuda" else "fp32"]
    run = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    if config == "bare":
        cmd = [*run, "train/online_rl.py", *args]
    else:
        digests = "0-13" if "digests 0-13" in config else "none"
        # one step more: the probe stops the trainer inside optimizer.step, before it logs that step's time
        cmd = [*run, "-m", "workers.probe", "--out", str(out / "probe"), "--steps", str(STEPS + 1), "--digest-steps",
               digests, "--watch-steps", "none", "--", "train/online_rl.py", *args]
    proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    log = log_dir / "train.jsonl"
    try:
        while proc.poll() is None:
            if config == "bare" and len(_trainer_steps(log)) >= STEPS:
                break  # the bare trainer runs to total_steps: stop it from outside after 16 steps
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    times = _trainer_steps(log)[:STEPS]
    if len(times) < STEPS:
        raise SystemExit(f"{config}: the trainer logged {len(times)} of {STEPS} steps; see {out}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default=None)
    ap.add_argument("--nproc", type=int, default=None)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / ".orch" / "bench" / "probe.json")
    args = ap.parse_args()
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    nproc = args.nproc or (1 if device == "cuda" else 2)
    work = Path(tempfile.mkdtemp(prefix="orch-bench-probe-"))
    try:
        code = work / "r3_mini"
        shutil.copytree(REPO / "examples" / "r3_mini", code, ignore=shutil.ignore_patterns("__pycache__"))
        init = work / "init.safetensors"
        subprocess.run([sys.executable, "train/make_init.py", "--out", str(init), "--seed", "1"], cwd=code, check=True,
                       env={**os.environ, "PYTHONPATH": PYPATH})
        per: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for rep in range(args.reps):
            order = CONFIGS if rep % 2 == 0 else tuple(reversed(CONFIGS))  # alternate to cancel drift
            for config in order:
                per[config].extend(run_once(config, code, work, device, nproc, init)[FIRST_TIMED:])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bare = statistics.median(per["bare"])
    rows = [{"config": c, "median_step_ms": statistics.median(v) * 1e3, "n": len(v),
             "overhead": statistics.median(v) / bare - 1} for c, v in per.items()]
    print(f"probe overhead on r3-mini ({device}, {nproc} rank(s), trainer-logged step_time, steps "
          f"{FIRST_TIMED}-{STEPS - 1}, {args.reps} launches each, medians)")
    print(f"{'configuration':<22} {'median step ms':>15} {'overhead':>9} {'n':>4}")
    for r in rows:
        print(f"{r['config']:<22} {r['median_step_ms']:>15.2f} {r['overhead'] * 100:>8.2f}% {r['n']:>4}")
    print("goals: <= 1% without digests; <= 3% with digests (CUDA)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "probe_overhead", "device": device, "nproc": nproc,
                                    "reps": args.reps, "rows": rows, "torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
