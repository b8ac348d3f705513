"""`make bench-init-seal`: what the shared initial state's checks cost a run, before and after issue 51's change.

orch checks init.safetensors (every arm loads it) before and after each package of a run's plan
(orchestrator/run/run_plan._check_sealed). Before, the check after every package hashed the file (SHA256); now it
compares the lstat fingerprint after every package and hashes the file only after the last package that reads it
(last_init_reader). This runs both schedules over a real plan (`protocol.plan.plan`: K = 1, or an A/A launch) against
a file of the given size, with orch's own functions, alternated, and prints the medians: seconds of orch's own work
between packages, which holds the GPU lock and no package runs.

    python bench/bench_init_seal.py [--gib 3.24] [--repeats 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from orchestrator.isolation.safe_paths import file_fingerprint
from orchestrator.run.run_plan import _check_sealed, _sealed_unchanged, last_init_reader
from protocol.hashing import sha256_file
from protocol.plan import plan


class _NoCaches:  # the compile-cache checks are not what this measures
    def check_baseline(self, when: str) -> None:
        pass

    def check_copy(self, cache: Path) -> None:
        pass


def schedule(ctx: Any, digest: str, packages: list[Any], every: bool) -> float:
    """Seconds of the initial state's checks over one plan: before each package and after it, the content after
    every package (every=True, the old schedule) or after the last that reads it."""
    last = last_init_reader(packages)
    t0 = time.perf_counter()
    for i, pkg in enumerate(packages[1:], start=1):  # the checks package makes the file; the rest read it
        reads = pkg.kind != "score"
        assert _sealed_unchanged(ctx, ctx.scratch, digest if reads else None) is None
        _check_sealed(ctx, f"during {pkg.name}", digest if reads else None, content=every or i == last)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=3.24, help="GiB of the initial state (r3-mini GPU-bound: 3.48 GB)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    plans = {"K = 1 run": list(plan(1)), "A/A launch": list(plan(1, calibration=True))}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-init-") as tmp:
        scratch = Path(tmp)
        init = scratch / "init.safetensors"
        block = os.urandom(1 << 24)
        with init.open("wb") as f:
            for _ in range(int(args.gib * (1 << 30)) // len(block)):
                f.write(block)
        t0 = time.perf_counter()
        digest = sha256_file(init)
        one_hash = time.perf_counter() - t0
        ctx = SimpleNamespace(sealed={}, caches=_NoCaches(), checkpoints={}, scratch=scratch,
                              init_stat=file_fingerprint(init))
        for name, packages in plans.items():
            before, after = [], []
            for _ in range(args.repeats):  # alternated, so that the page cache and the host treat both alike
                before.append(schedule(ctx, digest, packages, every=True))
                after.append(schedule(ctx, digest, packages, every=False))
            rows.append({"plan": name, "packages": len(packages), "before_s": statistics.median(before),
                         "after_s": statistics.median(after), "before_all": before, "after_all": after})
        size = init.stat().st_size
    print(f"initial state {size / 1e9:.2f} GB; one SHA256 of it: {one_hash:.2f} s (first read)")
    print("plan | packages | before: hashed after every package (s) | after: after the last reader (s) | saved (s)")
    for r in rows:
        print(f"{r['plan']} | {r['packages']} | {r['before_s']:.2f} | {r['after_s']:.2f} | "
              f"{r['before_s'] - r['after_s']:.2f}")
    if args.out is not None:
        args.out.write_text(json.dumps({"schema": "orch.bench/init_seal/1", "bytes": size, "repeats": args.repeats,
                                        "first_hash_s": one_hash, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
