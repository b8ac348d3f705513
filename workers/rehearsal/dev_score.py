"""The rehearsal's DEV scorer: a statistic of the trained checkpoint, written as sealed metrics (not a quality score).

The owner's DEV judge stays external; a rehearsal only needs a scorer that reads arm C's checkpoint through the
same sealed path. Usage: python -m workers.rehearsal.dev_score --ckpt DIR --out FILE
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

import torch


def checkpoint_statistics(ckpt_dir: str) -> dict[str, object]:
    """Sum of squares (float64) and element count of every trained parameter shard in the orch.ckpt/1 files."""
    files = sorted(glob.glob(os.path.join(ckpt_dir, "rank*.pt")))
    if not files:
        raise SystemExit(f"dev_score: no rank*.pt checkpoint in {os.path.basename(ckpt_dir)}")
    total, elements, tensors = 0.0, 0, 0
    for path in files:
        doc = torch.load(path, map_location="cpu", weights_only=True)
        if doc.get("schema") != "orch.ckpt/1":
            raise SystemExit(f"dev_score: {os.path.basename(path)} is not an orch.ckpt/1 checkpoint")
        for t in doc["params"].values():
            total += float(t.double().pow(2).sum())
            elements += t.numel()
            tensors += 1
    return {"kind": "rehearsal checkpoint statistic (not a quality metric)", "param_sumsq": total,
            "param_elements": elements, "param_tensors": tensors, "ranks": len(files)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m workers.rehearsal.dev_score")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", required=True)
    opts = ap.parse_args(argv)
    with open(opts.out, "w") as f:
        json.dump(checkpoint_statistics(opts.ckpt), f, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
