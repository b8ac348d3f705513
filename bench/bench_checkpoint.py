"""`make bench-checkpoint`: the probe's end-of-launch checkpoint (workers/rank/probe_model.save_checkpoint, orch.ckpt/1)
three ways, in one process, in rotating order, REPEATS times each: save (copy to CPU, torch.save, SHA256 of the file)
and load (torch.load, as the reload package reads it). The ways: with the zip records' CRC32 and the file read back for
its SHA256 (orch before 1bed668), without the CRC32 and read back (1bed668), and without the CRC32, hashed as it is
written (orch now: save_checkpoint). Prints a table of medians and writes the figures (JSON). The loaded tensors are
checked equal to the saved ones, and each way's returned SHA256 to the file's.

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
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  (the bench times the rank's own code, which runs under torch)

from protocol.fileio import regular_sha256  # noqa: E402
from workers.rank.probe_model import checkpoint_doc, save_checkpoint, zip_crc32_set  # noqa: E402


def read_back(crc: bool) -> Callable[[dict[str, torch.Tensor], Path], tuple[str, str]]:
    """The save as orch wrote it before: torch.save to the path, then the file read back for its SHA256."""

    def save(tensors: dict[str, torch.Tensor], folder: Path) -> tuple[str, str]:
        folder.mkdir(parents=True, exist_ok=True)
        path, tmp = folder / "rank0.pt", folder / "rank0.pt.tmp"
        with zip_crc32_set(crc):
            torch.save(checkpoint_doc(tensors, 0, 1), tmp)
        os.replace(tmp, path)
        return path.name, regular_sha256(path)

    return save


WAYS: dict[str, Callable[[dict[str, torch.Tensor], Path], tuple[str, str]]] = {
    "zip CRC32, read back (before 1bed668)": read_back(True),
    "no CRC32, read back (1bed668)": read_back(False),
    "no CRC32, hashed as written (orch now)": lambda t, f: save_checkpoint(t, f, rank=0, world_size=1),
}


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
    with tempfile.TemporaryDirectory(prefix="orch-bench-ckpt-") as tmp:
        for r in range(opts.repeats):
            order = list(WAYS.items())
            for i, (way, save) in enumerate(order[r % len(order):] + order[: r % len(order)]):
                folder = Path(tmp) / f"{r}-{i}"
                t0 = time.perf_counter()
                name, sha = save(tensors, folder)
                t1 = time.perf_counter()
                if sha != regular_sha256(folder / name):
                    raise SystemExit(f"bench-checkpoint: the SHA256 returned differs from the file's ({way})")
                doc = torch.load(folder / name, map_location="cpu", weights_only=True)
                t2 = time.perf_counter()
                for full, t in tensors.items():
                    kind, _, rest = full.partition("/")
                    got = doc["params"][rest] if kind == "param" else doc["optim"][rest.rpartition("/")[0]]["exp_avg"]
                    if not torch.equal(got, t.cpu()):
                        raise SystemExit(f"bench-checkpoint: {full} did not load back equal ({way})")
                times[way]["save_s"].append(t1 - t0)
                times[way]["load_s"].append(t2 - t1)
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
    medians = [statistics.median(t["save_s"]) for t in times.values()]
    names = list(WAYS)
    for i in range(1, len(names)):
        rows.append(f"save: {medians[0] / medians[i]:.2f}x faster than '{names[0]}' for '{names[i]}' "
                    f"(median of {opts.repeats})")
    figures["save_speedup_vs_first"] = {names[i]: medians[0] / medians[i] for i in range(1, len(names))}
    figures["save_speedup_hashed_as_written"] = medians[1] / medians[2]
    rows.append(f"save: {medians[1] / medians[2]:.2f}x faster hashed as written than read back (no CRC32 both)")
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(figures, indent=1) + "\n")
    print("\n".join(rows))
    print(f"figures: {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
