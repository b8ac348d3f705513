"""Benchmark of the TRL GRPO candidate without orch: TRL's default (gradient checkpointing on) against
`--gradient_checkpointing False`, each run being the user's own script (examples/trl_grpo/train_grpo.py) under
torchrun on 2 CPU ranks with the frozen recipe's flags.

Each run's step times come from a TrainerCallback (perf_counter around each optimizer step, rank 0) added by
wrapping GRPOTrainer.__init__ from outside the script; the figure per run is the median of steps 10-15 (the owner's
measured windows). Runs alternate on, off, on, off...; the table gives each arm's median over runs and the ratio
on/off (> 1: the candidate is faster). Needs the `trl` extra (`make test-trl` installs it).

Usage: python bench/bench_trl_gc.py [--runs 3] [--layers 4 --hidden-size 512 --batch 16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "trl_grpo"

# run as the torchrun entry point: the user's script with a timing callback added from outside
TIMED = """
import json, os, runpy, sys, time
import trl
from transformers import TrainerCallback

times = []

class StepTimer(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        times.append(time.perf_counter() - self.t0)

init = trl.GRPOTrainer.__init__

def timed_init(self, *args, **kwargs):
    kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), StepTimer()]
    init(self, *args, **kwargs)

trl.GRPOTrainer.__init__ = timed_init
sys.path.insert(0, os.getcwd())
sys.argv = ["train_grpo.py", *sys.argv[1:]]
runpy.run_path("train_grpo.py", run_name="__main__")
if os.environ.get("RANK", "0") == "0":
    with open(os.environ["BENCH_TIMES"], "w") as f:
        json.dump(times, f)
"""


def one_run(work: Path, gc: bool, opts: argparse.Namespace, n: int) -> float:
    """Median step time of steps 10-15 of one torchrun of the user's script."""
    times = work / f"times{n}.json"
    wrapper = work / "timed.py"
    wrapper.write_text(TIMED)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(wrapper),
        "--output_dir", str(work / f"out{n}"), "--bf16", "False", "--use_cpu", "True", "--report_to", "none",
        "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "True", "--max_steps", "16",
        "--learning_rate", "1e-5", "--warmup_steps", "10", "--beta", "0.04", "--num_generations", "4",
        "--per_device_train_batch_size", str(opts.batch), "--max_completion_length", "16", "--seed", "42",
        "--layers", str(opts.layers), "--hidden_size", str(opts.hidden_size),
        "--gradient_checkpointing", str(gc),
    ]  # fmt: skip
    env = {**os.environ, "BENCH_TIMES": str(times), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, cwd=SCRIPT, env=env, capture_output=True, text=True, timeout=900, check=False)
    if not times.is_file():
        raise SystemExit(f"run {n} (gradient_checkpointing={gc}) failed, exit {done.returncode}:\n"
                         f"{done.stderr[-3000:]}")
    steps = json.loads(times.read_text())
    return statistics.median(steps[10:16])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per arm, alternated")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden-size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=16, help="per_device_train_batch_size")
    ap.add_argument("--out", type=Path, default=None, help="write the figures (JSON) here")
    opts = ap.parse_args()
    medians: dict[str, list[float]] = {"on": [], "off": []}
    with tempfile.TemporaryDirectory(prefix="orch-bench-trl-") as tmp:
        for i in range(opts.runs):
            for arm, gc in (("on", True), ("off", False)):
                medians[arm].append(one_run(Path(tmp), gc, opts, len(medians["on"]) + len(medians["off"])))
                print(f"run {i + 1} gradient checkpointing {arm}: {medians[arm][-1]:.4f} s/step", flush=True)
    on, off = statistics.median(medians["on"]), statistics.median(medians["off"])
    size = f"{opts.layers} layers x {opts.hidden_size}, {opts.batch} completions a device"
    print(f"\nTRL GRPO on 2 CPU ranks ({size}), median s/step of steps 10-15 over {opts.runs} runs per arm")
    print("arm | runs | median s/step")
    for arm, label, mid in (("on", "on (TRL default, baseline)", on), ("off", "off (candidate)", off)):
        print(f"gradient checkpointing {label} | {' / '.join(f'{x:.4f}' for x in medians[arm])} | {mid:.4f}")
    print(f"ratio on/off: {on / off:.3f}x; every candidate run faster than every baseline run: "
          f"{max(medians['off']) < min(medians['on'])}")
    if opts.out is not None:
        opts.out.write_text(json.dumps({"layers": opts.layers, "hidden_size": opts.hidden_size, "batch": opts.batch,
                                        "runs": opts.runs, "s_per_step": medians, "ratio_on_off": on / off},
                                       indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
