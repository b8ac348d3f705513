"""`make bench-checkpoint`: the probe's end-of-launch checkpoint (workers/rank/probe_model.save_checkpoint, orch.ckpt/1)
with and without the zip records' CRC32, in one process, alternating, REPEATS times each: save (copy to CPU, torch.save,
SHA256 of the file) and load (torch.load, as the reload package reads it). Prints a table of medians and writes the
figures (JSON). The loaded tensors are checked equal to the saved ones, and the two files' tensors to each other.

Usage: python bench/bench_checkpoint.py [--gib 2] [--repeats 3] [--device cpu|cuda] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  (the bench times the rank's own code, which runs under torch)

from workers.rank.probe_model import save_checkpoint  # noqa: E402

WAYS = {"with zip CRC32 (before)": True, "without zip CRC32 (orch now)": False}


def state(gib: float, device: str) -> dict[str, torch.Tensor]:
    """param/... and optim/.../exp_avg tensors of fp32, 16 of each, `gib` GiB in all (seeded)."""
    gen = torch.Generator().manual_seed(0)
    n = int(gib * 1024**3 / 4 / 32)
    out = {}
    for i in range(16):
        out[f"param/layer{i}.weight"] = torch.randn(n, generator=gen).to(device)
        out[f"optim/layer{i}.weight/exp_avg"] = torch.randn(n, generator=gen).to(device)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".orch/bench")) / "bench_checkpoint.json")
    opts = ap.parse_args()
    tensors = state(opts.gib, opts.device)
    times: dict[str, dict[str, list[float]]] = {w: {"save_s": [], "load_s": []} for w in WAYS}
    shas: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="orch-bench-ckpt-") as tmp:
        for r in range(opts.repeats):
            for way, crc in (WAYS.items() if r % 2 == 0 else reversed(WAYS.items())):
                folder = Path(tmp) / f"{r}-{crc}"
                t0 = time.perf_counter()
                name, sha = save_checkpoint(tensors, folder, rank=0, world_size=1, zip_crc32=crc)
                t1 = time.perf_counter()
                doc = torch.load(folder / name, map_location="cpu", weights_only=True)
                t2 = time.perf_counter()
                for full, t in tensors.items():
                    kind, _, rest = full.partition("/")
                    got = doc["params"][rest] if kind == "param" else doc["optim"][rest.rpartition("/")[0]]["exp_avg"]
                    if not torch.equal(got, t.cpu()):
                        raise SystemExit(f"bench-checkpoint: {full} did not load back equal ({way})")
                times[way]["save_s"].append(t1 - t0)
                times[way]["load_s"].append(t2 - t1)
                shas.setdefault(way, sha)
                del doc
                (folder / name).unlink()
    rows = ["way | GiB | save s (median) | load s (median) | save runs"]
    figures: dict[str, object] = {"gib": opts.gib, "repeats": opts.repeats, "device": opts.device,
                                  "torch": torch.__version__, "ways": {}}  # fmt: skip
    for way, t in times.items():
        save, load = statistics.median(t["save_s"]), statistics.median(t["load_s"])
        figures["ways"][way] = {"save_s": t["save_s"], "load_s": t["load_s"], "save_median_s": save,  # type: ignore[index]
                                "load_median_s": load}  # fmt: skip
        rows.append(f"{way} | {opts.gib:g} | {save:.2f} | {load:.2f} | " + ", ".join(f"{x:.2f}" for x in t["save_s"]))
    before, after = (statistics.median(times[w]["save_s"]) for w in WAYS)
    rows.append(f"save: {before / after:.2f}x faster without the zip CRC32 (median of {opts.repeats})")
    figures["save_speedup"] = before / after
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(figures, indent=1) + "\n")
    print("\n".join(rows))
    print(f"figures: {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
