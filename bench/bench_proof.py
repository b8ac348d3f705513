"""Issue 51's figures: what a run spends proving its timed launches (checks, prime, reloads, the watched replay, score)
beyond the timed A, C, B themselves, per run, from the ledger; with --protocol, N launches of it in a fresh home first
(the first primes and keeps its compile cache, the later ones load it). Prints one line per run and writes --out;
where the home holds A/A launches, also the decision line: the calibration plus one run of the protocol on a kept
cache, against that run's timed triplet (issue 51's goal: at most 5x for 3 A/A launches and one K = 1 run).

Usage: python bench/bench_proof.py --protocol protocol/r3_mini.yaml --runs 2 [--out FILE]
       python bench/bench_proof.py --home DIR [--out FILE]   (the runs already in a home: a rehearsal's, say)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from ledger.cost.overhead import overhead_lines, overhead_total, run_overheads  # noqa: E402
from ledger.cost.store import Ledger  # noqa: E402
from protocol.home import resolve_home  # noqa: E402


def launches(protocol: Path, home: Path, runs: int) -> list[dict[str, Any]]:
    out = []
    for i in range(runs):
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", "launch", str(protocol),
                               "--home", str(home)], cwd=REPO, capture_output=True, text=True, timeout=3600)
        out.append({"launch": i + 1, "exit": done.returncode, "wall_s": round(time.monotonic() - t0, 1)})
        said = [ln for ln in done.stderr.splitlines() if ln.startswith("compile cache:")]
        print(f"launch {i + 1}: exit {done.returncode} in {out[-1]['wall_s']} s; " + "; ".join(said), flush=True)
    return out


def per_run(home: Path) -> list[dict[str, Any]]:
    h = resolve_home(home)
    rows = run_overheads(Ledger(h.ledger_path).records())
    for row in rows:
        run_json = h.runs / row["run_id"] / "run.json"
        audit = h.runs / row["run_id"] / "audit.json"
        doc = json.loads(run_json.read_text()) if run_json.is_file() else {}
        cc = doc.get("compile_cache") or {}
        row["compile_cache"] = {k: cc.get(k) for k in ("reused", "sealed_by", "prime_steps", "entries", "reason")}
        row["calibration"] = doc.get("calibration_of") is not None
        row["lock_held_s"] = row["between_packages_s"] = None
        if audit.is_file():
            a = json.loads(audit.read_text())
            row["exact"] = a.get("exact")
            row["verdict"] = a.get("verdict")
            # the lock's hold and the part of it no package ran in, as the audit gives them (runs since 8698e8f)
            row["lock_held_s"] = a["cost"].get("lock_held_s")
            row["between_packages_s"] = a["cost"].get("between_packages_s")
    return rows


def decision_cost(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Issue 51's goal on a host with a kept cache: a calibration's A/A launches plus one run of the protocol, as a
    multiple of that run's timed triplet. An A/A launch counts without its prime: the one that primed a cold host ran
    the rest of its packages on the cache it had just sealed, as a kept cache serves every later one. The run is the
    latest one in the home that is not an A/A launch and loaded a kept cache; without one, the A/A launches alone,
    each against its own timed triplet. None without an A/A launch that held a GPU (a CPU protocol has no GPU-s)."""
    aa = [r for r in rows if r["calibration"]]
    if not any(r["timed_gpu_seconds"] for r in aa):
        return None
    spent = [r["total_gpu_seconds"] - r["by_kind"].get("prime", 0.0) for r in aa]
    out: dict[str, Any] = {"aa_runs": [r["run_id"] for r in aa], "aa_gpu_seconds": sum(spent),
                           "aa_of_timed": [s / r["timed_gpu_seconds"] if r["timed_gpu_seconds"] else None
                                           for s, r in zip(spent, aa, strict=True)],
                           "run": None, "total_gpu_seconds": None, "of_timed": None}
    kept = [r for r in rows if not r["calibration"] and r["compile_cache"].get("reused")]
    if kept:
        run = kept[-1]
        total, timed = out["aa_gpu_seconds"] + run["total_gpu_seconds"], run["timed_gpu_seconds"]
        out.update(run=run["run_id"], run_gpu_seconds=run["total_gpu_seconds"], timed_gpu_seconds=timed,
                   total_gpu_seconds=total, of_timed=total / timed if timed else None)
    return out


def decision_line(cost: dict[str, Any]) -> str:
    each = ", ".join("n/a" if x is None else f"{x:.2f}x" for x in cost["aa_of_timed"])
    head = (f"decision on a kept cache: {len(cost['aa_runs'])} A/A launch(es) {cost['aa_gpu_seconds']:.1f} GPU-s "
            f"without their primes ({each} of each one's timed triplet)")
    if cost["run"] is None or cost["of_timed"] is None:
        return head + "; no run of the protocol loaded a kept cache in this home"
    return (head + f" + run {cost['run']} {cost['run_gpu_seconds']:.1f} GPU-s = {cost['total_gpu_seconds']:.1f} "
            f"GPU-s, {cost['of_timed']:.2f}x that run's timed triplet ({cost['timed_gpu_seconds']:.1f} GPU-s)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocol", type=Path, help="launch it --runs times in a fresh home first")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--home", type=Path, help="read the runs of this home (no launch)")
    ap.add_argument("--out", type=Path, default=None)
    opts = ap.parse_args()
    if (opts.protocol is None) == (opts.home is None):
        ap.error("give --protocol or --home")
    launched: list[dict[str, Any]] = []
    home = opts.home or Path(tempfile.mkdtemp(prefix="bench-proof-"))
    if opts.protocol is not None:
        launched = launches(opts.protocol.resolve(), home, opts.runs)
    rows = per_run(home)
    for line, row in zip(overhead_lines(rows), [*rows, None], strict=True):
        hold = "" if row is None or row["lock_held_s"] is None else (
            f", lock held {row['lock_held_s']:.1f} s, {row['between_packages_s']:.1f} s of it between packages")
        extra = "" if row is None else (
            f" [{'A/A ' if row['calibration'] else ''}cache "
            f"{'loaded from ' + str(row['compile_cache']['sealed_by']) if row['compile_cache']['reused'] else 'primed'}"
            f"{'' if row.get('exact') is None else ', exact' if row['exact'] else ', NOT exact'}{hold}]")
        print(line + extra)
    decision = decision_cost(rows)
    if decision is not None:
        print(decision_line(decision))
    doc = {"schema": "orch.bench-proof/1", "protocol": None if opts.protocol is None else opts.protocol.name,
           "launches": launched, "runs": rows, "total": overhead_total(rows), "decision": decision}
    if opts.out is not None:
        opts.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return 0 if all(x["exit"] == 0 for x in launched) else 1


if __name__ == "__main__":
    sys.exit(main())
