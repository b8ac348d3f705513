"""Issue 32: what a package costs before the trainer's first step, phase by phase (orchestrator/run/startup.py), on
r3-mini's 2 CPU ranks with the e2e suite's quick protocol (tests/e2e/launchutil.quick_protocol: 12 steps). Runs
--launches fresh launches one after another and prints, per phase, the median over every train, prime and replay
package of them, then each package kind's median wall time. --out FILE writes the figures (JSON).

--floor instead times, --repeats times each and alternating, the fresh interpreters every package starts: Python
alone, Python importing torch, then Dynamo (what `torch.use_deterministic_algorithms` or the first optimizer step
imports), and torchrun's agent with its rendezvous around a rank that runs nothing (`--no-python true`). Wall and
CPU seconds (the children's user + sys), medians: what no change to orch can take out of a fresh rank.

Usage: python bench/bench_startup.py [--launches 2] [--out FILE]   (about 1-2 min a launch on 2 cores)
       python bench/bench_startup.py --floor [--repeats 5] [--out FILE]   (about 1 min)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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

from orchestrator.run.startup import PHASES, WORDS  # noqa: E402


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


# what each fresh interpreter of a package pays before any of the trainer's own work
FLOOR: dict[str, list[str]] = {
    "python": [sys.executable, "-c", "pass"],
    "import torch": [sys.executable, "-c", "import torch"],
    "import torch, then Dynamo": [sys.executable, "-c", "import torch; torch.use_deterministic_algorithms(True)"],
    "torchrun agent, rendezvous, a no-op rank": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                 "--nproc_per_node=1", "--no-python", "true"],
}


def provenance() -> dict[str, object]:
    """The commit, whether this script differs from it, and the command as run (relative paths)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "script_differs_from_commit": bool(git("status", "--porcelain", "--",
            "bench/bench_startup.py")), "command": " ".join(["python", "bench/bench_startup.py", *sys.argv[1:]])}


def floor(repeats: int) -> dict[str, dict[str, float]]:
    """Median wall and CPU seconds of each FLOOR command, the commands alternating within each repeat."""
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in FLOOR}
    quiet = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for _ in range(repeats):
        for name, cmd in FLOOR.items():
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.monotonic()
            subprocess.run(cmd, check=True, env=quiet, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wall = time.monotonic() - t0
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
            seen[name].append((wall, cpu))
    out = {name: {"wall_s": round(statistics.median(w for w, _ in v), 3),
                  "cpu_s": round(statistics.median(c for _, c in v), 3)} for name, v in seen.items()}
    print(f"fresh interpreters, median of {repeats} (seconds):")
    print(f"  {'what':<42} {'wall':>6} {'cpu':>6}")
    for name, v in out.items():
        print(f"  {name:<42} {v['wall_s']:>6.2f} {v['cpu_s']:>6.2f}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--floor", action="store_true", help="time the fresh interpreters a package starts, not launches")
    ap.add_argument("--repeats", type=int, default=5, help="--floor: times each command runs")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.floor:
        figures = floor(args.repeats)
        if args.out is not None:
            doc = {"schema": "orch.bench.startup-floor/1", **provenance(), "repeats": args.repeats, "median": figures}
            args.out.write_text(json.dumps(doc, indent=1) + "\n")
        return 0
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
        args.out.write_text(json.dumps({"schema": "orch.bench.startup/1", **provenance(), "phases_median_s": phases,
                                        "package_wall_median_s": walls, "launches": launches}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
