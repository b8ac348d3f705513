"""Issue 31's goal on CPU: an identical candidate of the tuned-kernel toy (tests/fixtures/tuned_sum.py in r3-mini:
three kernels that pick a block size by timing, two cold ranks forced to pick differently) is exact in N of N fresh
launches, each on cold caches. Prints a table and writes its figures to --out (JSON).

Usage: python bench/bench_tuned_kernels.py [--runs 20] [--out FILE]  (each launch ~1-2 min on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from launchutil import env, launch_cmd, only_run  # noqa: E402
from test_tuned_kernels import tuned_project  # noqa: E402


def one(base: Path) -> dict[str, object]:
    proj, protocol = tuned_project(base)
    home = base / "home"
    t0 = time.monotonic()
    done = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=1200)
    wall = time.monotonic() - t0
    run_dir = only_run(home)
    audit = json.loads((run_dir / "audit.json").read_text()) if (run_dir / "audit.json").exists() else None
    if audit is None:
        return {"exit": done.returncode, "exact": None, "wall_s": wall, "why": done.stderr.strip()[-300:]}
    cc = audit.get("compile_cache") or {}
    return {"exit": done.returncode, "exact": audit["exact"], "wall_s": round(wall, 1),
            "tensors_compared": audit["exactness"]["tensors_compared"], "ranks": audit["exactness"]["ranks"],
            "tuned": (cc.get("baseline") or {}).get("tuned"),
            "launches_on_baseline_picks": len(cc.get("same_baseline_picks") or []),
            "prime_share": cc.get("prime_share")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="orch-tuned-") as tmp:
            row = one(Path(tmp))
        rows.append(row)
        print(f"{i + 1:>3}  exact {row['exact']!s:<5}  exit {row['exit']}  {row['wall_s']:>6} s  "
              f"launches on the prime's picks {row.get('launches_on_baseline_picks')}", flush=True)
    exact = sum(r["exact"] is True for r in rows)
    print(f"exact: {exact} of {len(rows)} identical-candidate launches (2 ranks, cold caches, forced to tune apart)")
    if args.out is not None:
        args.out.write_text(json.dumps({"schema": "orch.bench.tuned-kernels/1", "runs": rows, "exact": exact,
                                        "of": len(rows)}, indent=1) + "\n")
    return 0 if exact == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
