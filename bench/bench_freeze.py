"""Benchmark of `orch freeze` hashing: one large file and many small files, against `sha256sum` on the same data.

Prints a table and writes the figures (JSON) to --out; goal: >= 0.8 of sha256sum's bytes per second.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from manifests.core import hash_tree


def _median_time(fn: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sha256sum(root: Path, files: list[str]) -> None:
    # xargs batches the argument list like a user would; one sha256sum process per batch
    subprocess.run(["xargs", "-0", "sha256sum"], input="\0".join(files).encode(), cwd=root,
                   stdout=subprocess.DEVNULL, check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--large-mib", type=int, default=1024)
    ap.add_argument("--small-count", type=int, default=20000)
    ap.add_argument("--small-bytes", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(".orch/bench/freeze.json"))
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-freeze-"))
    rows = []
    try:
        large = tmp / "large"
        large.mkdir()
        with open(large / "blob.bin", "wb") as f:
            for _ in range(args.large_mib):
                f.write(os.urandom(1 << 20))
        small = tmp / "small"
        for i in range(args.small_count):
            d = small / f"d{i % 100}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i}.py").write_bytes(os.urandom(args.small_bytes))
        cases = [("one large file", large, ["*.bin"]), ("many small files", small, ["**/*.py"])]
        for label, root, include in cases:
            manifest = hash_tree(root, include)  # warm the page cache, list the files once
            files = [e.path for e in manifest.entries]
            nbytes = sum(e.size for e in manifest.entries)
            t_orch = _median_time(lambda root=root, include=include: hash_tree(root, include), args.repeats)
            t_ref = _median_time(lambda root=root, files=files: _sha256sum(root, files), args.repeats)
            rows.append({
                "case": label, "files": len(files), "bytes": nbytes,
                "orch_s": t_orch, "sha256sum_s": t_ref,
                "orch_MBps": nbytes / t_orch / 1e6, "sha256sum_MBps": nbytes / t_ref / 1e6,
                "ratio": t_ref / t_orch,
            })
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{'case':<18} {'files':>7} {'MiB':>7} {'orch MB/s':>10} {'sha256sum MB/s':>15} {'ratio':>6}")
    for r in rows:
        print(f"{r['case']:<18} {r['files']:>7} {r['bytes'] / 2**20:>7.0f} {r['orch_MBps']:>10.0f} "
              f"{r['sha256sum_MBps']:>15.0f} {r['ratio']:>6.2f}")
    print("goal: ratio >= 0.80 (orch bytes/s over sha256sum bytes/s, medians of", args.repeats, "runs)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "freeze", "cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
