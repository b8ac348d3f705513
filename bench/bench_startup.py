"""Issue 32: what a package costs before the trainer's first step, phase by phase (orchestrator/startup.py), on
r3-mini's 2 CPU ranks with the e2e suite's quick protocol (tests/e2e/launchutil.quick_protocol: 12 steps). Runs
--launches fresh launches one after another and prints, per phase, the median over every train, prime and replay
package of them, then each package kind's median wall time. --out FILE writes the figures (JSON).

Usage: python bench/bench_startup.py [--launches 2] [--out FILE]   (about 1-2 min a launch on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from launchutil import edit_protocol, env, launch_cmd, make_project, only_run, quick_protocol  # noqa: E402

from orchestrator.startup import PHASES, WORDS  # noqa: E402


def one(base: Path) -> dict[str, object]:
    proj = make_project(base)
    protocol = edit_protocol(proj, quick_protocol)
    home = base / "home"
    t0 = time.monotonic()
    done = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=1200)
    wall = time.monotonic() - t0
    if done.returncode not in (0, 1):  # 1: a verdict other than accepted; the packages still ran
        raise SystemExit(f"the launch failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    run = json.loads((only_run(home) / "run.json").read_text())
    packages = [{"name": p["name"], "kind": p["kind"], "wall_s": p.get("wall_s"), "startup": p.get("startup")}
                for p in run["packages"]]
    return {"wall_s": round(wall, 1), "packages": packages}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    launches = []
    for _ in range(args.launches):
        with tempfile.TemporaryDirectory(prefix="orch-startup-") as tmp:
            launches.append(one(Path(tmp)))
    timed = [p["startup"] for launch in launches for p in launch["packages"] if p["startup"]]  # type: ignore[attr-defined]
    phases = {name: statistics.median(s[name] for s in timed) for name in [*PHASES, "total"]}
    print(f"start-up of {len(timed)} train/prime/replay packages in {len(launches)} launches "
          "(r3-mini, 2 CPU ranks, quick protocol), median seconds:")
    for name, value in phases.items():
        print(f"  {name:<18} {value:>7.2f}  {WORDS.get(name, 'set-up begun to the end of step 0')}")
    kinds: dict[str, list[float]] = {}
    for launch in launches:
        for p in launch["packages"]:  # type: ignore[attr-defined]
            kinds.setdefault(p["kind"], []).append(p["wall_s"])
    walls = {k: statistics.median(v) for k, v in kinds.items()}
    print("package wall, median seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in walls.items()))
    print("launch wall, seconds: " + ", ".join(str(x["wall_s"]) for x in launches))
    if args.out is not None:
        args.out.write_text(json.dumps({"schema": "orch.bench.startup/1", "phases_median_s": phases,
                                        "package_wall_median_s": walls, "launches": launches}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
