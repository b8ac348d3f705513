"""Benchmark of a package's isolation: the start-up and end cost of each mode on a trivial package command.

Runs `python -c pass` as a package runs its worker (own process group, watchdog) bare and under each isolation
mode (namespace: read-only root + PID namespace; scan+cgroup; scan+token-scan), then the token scan every package
ends with. Prints a table and writes the figures (JSON) to --out; goal: <= 1 s of overhead per package.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from orchestrator.isolation.package_isolation import cgroups_work, isolate, namespaces_work
from orchestrator.isolation.process_group import spawn_in_group, wait_group
from orchestrator.isolation.stragglers import end_stragglers, new_token
from orchestrator.isolation.surface import surface_dirs

CMD = [sys.executable, "-c", "pass"]


def _bare(work: Path) -> None:
    wait_group(spawn_in_group(CMD, cwd=work))


def _isolated(work: Path, mode: str, n: int) -> None:
    scratch = work / "scratch"
    own = work / "run" / f"pkg{n}"
    own.mkdir(parents=True, exist_ok=True)
    iso = isolate(str(scratch), f"pkg{n}", [str(own)], mode, surface=surface_dirs({"PYTHONPATH": str(work)}))
    iso.start()
    cmd = iso.command(CMD, str(work))
    try:
        proc = spawn_in_group(cmd, env=iso.env(os.environ), cwd=work, **iso.spawn_args())
    finally:
        iso.spawned()
    try:
        wait_group(proc, on_exit=iso.leader_exited)
    finally:
        iso.finish()
    assert not iso.survivors and not iso.surface_changed() and not iso.written_outside()


def _timed(fn: object, repeats: int) -> list[float]:
    out = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn(i)  # type: ignore[operator]
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(".orch/bench/isolation.json"))
    args = ap.parse_args()
    modes = [m for m, ok in (("namespace", namespaces_work()), ("scan+cgroup", cgroups_work()),
                             ("scan+token-scan", True)) if ok]
    rows = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-isolation-") as tmp:
        work = Path(tmp)
        bare = _timed(lambda i: _bare(work), args.repeats)
        rows.append({"mode": "bare (own group, watchdog)", "median_s": statistics.median(bare), "max_s": max(bare)})
        for mode in modes:
            times = _timed(lambda i, m=mode: _isolated(work, m, i + 1000 * modes.index(m)), args.repeats)
            rows.append({"mode": mode, "median_s": statistics.median(times), "max_s": max(times)})
        token = new_token()
        scan = _timed(lambda i: end_stragglers(token), args.repeats)
        rows.append({"mode": "token scan after every package", "median_s": statistics.median(scan), "max_s": max(scan)})
    base = rows[0]["median_s"]
    print(f"{'mode':<32} {'median s':>9} {'max s':>7} {'overhead s':>11}")
    for r in rows:
        over = r["median_s"] - base if r is not rows[0] and not str(r["mode"]).startswith("token") else r["median_s"]
        r["overhead_s"] = over if r is not rows[0] else 0.0
        print(f"{r['mode']:<32} {r['median_s']:>9.3f} {r['max_s']:>7.3f} {r['overhead_s']:>11.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "isolation", "cpus": os.cpu_count(), "repeats": args.repeats,
                                    "load_1m": os.getloadavg()[0], "rows": rows}, indent=1))
    print(f"figures: {args.out}; load average (1 min) {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
