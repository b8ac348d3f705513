"""The probe's forbidden-dtype watch (workers/rank/watch.py): what it adds to a watched step on the CPU. One training
step of a small model (12 blocks of Linear, GELU, LayerNorm; AdamW), timed bare, under a dispatch mode that only passes
each op through (the floor of any op-level watch), and under the watch; the three alternate, --reps rounds of --steps
steps each, medians per step. --root DIR imports the watch from another checkout (a worktree of an earlier
commit), so that before and after run in one call.

Usage: python bench/bench_watch.py [--root DIR ...] [--reps 7] [--steps 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def load_watch(root: Path) -> Any:
    for name in [m for m in sys.modules if m == "workers" or m.startswith("workers.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        try:
            return importlib.import_module("workers.rank.watch")
        except ModuleNotFoundError:  # a checkout from before workers/rank/
            return importlib.import_module("workers.watch")
    finally:
        sys.path.remove(str(root))


def describe(root: Path) -> str:
    """The checkout's commit, and whether its watch.py differs from it (no path of this machine)."""
    git = ["git", "-C", str(root)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    watch = ["workers/rank/watch.py", "workers/watch.py"]  # the second: a checkout from before workers/rank/
    edited = subprocess.run([*git, "diff", "--quiet", "HEAD", "--", *watch]).returncode != 0
    return f"{commit or 'no commit'}{' + its uncommitted watch.py' if edited else ''}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", type=Path, action="append", default=[])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", type=Path)
    opts = ap.parse_args()
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)
    torch.manual_seed(0)
    blocks = [torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.GELU(), torch.nn.LayerNorm(32)) for _ in range(12)]
    model = torch.nn.Sequential(*blocks)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(8, 32)

    def step() -> None:
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    class PassThrough(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            return func(*args, **(kwargs or {}))

    configs: dict[str, Any] = {"bare": contextlib.nullcontext, "pass-through dispatch mode": PassThrough}
    for root in opts.root or [REPO]:
        watch = load_watch(root.resolve())
        log = watch.WatchLog()
        label = f"the watch at {describe(root)}"
        configs[label] = lambda w=watch, lg=log: w.make_watch(lg, lambda: True)
    per_step: dict[str, list[float]] = {name: [] for name in configs}
    for ctx in configs.values():  # warm-up: every path once
        with ctx():
            step()
    for _ in range(opts.reps):
        for name, ctx in configs.items():
            t0 = time.perf_counter()
            for _ in range(opts.steps):
                with ctx():
                    step()
            per_step[name].append((time.perf_counter() - t0) / opts.steps * 1e3)
    bare = statistics.median(per_step["bare"])
    rows = [{"config": name, "ms_per_step": round(statistics.median(v), 3),
             "x_bare": round(statistics.median(v) / bare, 2)} for name, v in per_step.items()]
    print(f"watched step, CPU, 1 thread: median of {opts.reps} rounds of {opts.steps} steps, the configs alternating")
    print(f"{'config':<60} {'ms/step':>9} {'x bare':>7}")
    for row in rows:
        print(f"{row['config']:<60} {row['ms_per_step']:>9.3f} {row['x_bare']:>7.2f}")
    if opts.out:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps({"torch": torch.__version__, "reps": opts.reps, "steps": opts.steps,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
