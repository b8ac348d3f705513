"""`make bench-verdict`: does the verdict err as often as it says? False accepts of identical arms and power on
known slowdowns, for fixed K = 1 with a calibration, K = 2, K = 3 and the sequential rule (issue 26).

--sim   a seeded Monte Carlo of whole runs' step times (bench/verdict_sim.py); figures to
        docs/validation/verdict_simulation.json (or --out)
--real  real `orch calibrate` / `orch launch` of r3-mini on this host (bench/verdict_real.py), decisions from
        disjoint triplets; figures to --out (default $OUT/bench_verdict_real.json)

Usage: python bench/bench_verdict.py --sim [--sequences N] [--seed S] [--check M] [--out FILE]
       python bench/bench_verdict.py --real [--device cpu|cuda] [--streams N] [--budget-s S] [--out FILE] ...
       python bench/bench_verdict.py --merge A.json B.json ... --out ALL.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from verdict_common import no_paths

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
SIM_OUT = REPO / "docs" / "validation" / "verdict_simulation.json"


def provenance() -> dict[str, Any]:
    """The commit, whether the files that make these figures differ from it, and the command (relative paths)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True).stdout

    dirty = git("status", "--porcelain", "--untracked-files=all", "--", "bench/bench_verdict.py",
                "bench/verdict_sim.py", "bench/verdict_real.py", "bench/bench_null.py",
                *(f"ledger/verdict/decide/{m}.py" for m in ("stats", "sequential", "windows", "evidence", "noise",
                                                            "decision")))
    argv = [os.path.relpath(sys.argv[0], REPO) if os.path.isabs(sys.argv[0]) else sys.argv[0],
            *(no_paths(a) for a in sys.argv[1:])]
    return {"commit": git("rev-parse", "HEAD").strip(),
            "files_differ_from_commit": [ln[3:] for ln in dirty.splitlines()], "command": "python " + shlex.join(argv)}


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def _ci(ci: list[float]) -> str:
    return f"[{_pct(ci[0])}, {_pct(ci[1])}]"


def sim_table(scenarios: list[dict[str, Any]]) -> str:
    head = ["scenario", "rule", "false accept (95% CP)", "power (95% CP)", "coverage", "mean triplets (+A/A)",
            "median half-width"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for sc in scenarios:
        for name, r in sc["rules"].items():
            fa = f"{_pct(r['false_accept_rate'])} {_ci(r['false_accept_ci95'])}" if "false_accept_rate" in r else ""
            pw = f"{_pct(r['power'])} {_ci(r['power_ci95'])}" if "power" in r else ""
            hw = "inf" if r["median_half_width"] is None else _pct(r["median_half_width"])
            cal = f" (+{r['calibration_triplets']})" if r["calibration_triplets"] else ""
            lines.append(" | ".join([sc["scenario"], name, fa, pw, _pct(r["coverage"]),
                                     f"{r['mean_triplets']:.2f}{cal}", hw]))
    return "\n".join(lines)


def run_sim(opts: argparse.Namespace) -> None:
    from verdict_sim import BEFORE, CAL_TRIPLETS, HOST, MAX_TRIPLETS, MEAN_RULE, RULES, SCENARIOS, SOURCES, simulate

    t0 = time.monotonic()
    results = []
    for i, sc in enumerate(SCENARIOS):
        results.append(simulate(sc, opts.sequences, opts.seed + i, opts.check))
        print(f"{sc.name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    table = sim_table(results)
    print(table)
    power = {sc["scenario"]: {"before": sc["rules"][BEFORE]["power"], "about_the_mean": sc["rules"][MEAN_RULE]["power"],
                              "after": sc["rules"]["K=1 + cal"]["power"]}
             for sc in results if "power" in sc["rules"]["K=1 + cal"]}
    worst = max((r["false_accept_ci95"][1], sc["scenario"], name) for sc in results for name, r in sc["rules"].items()
                if "false_accept_ci95" in r and name != BEFORE)
    figures = {
        "schema": "orch.bench-verdict-sim/1", **provenance(), "sequences_per_scenario": opts.sequences,
        "seed": opts.seed, "rules": list(RULES), "max_triplets": MAX_TRIPLETS, "calibration_triplets": CAL_TRIPLETS,
        "host_model": {"default": HOST.__dict__, "sources": SOURCES}, "scenarios": results, "table": table,
        "k1_cal_power_before_after": power, "largest_false_accept_upper_bound": list(worst),
        "wall_s": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    out = opts.out or SIM_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"figures: {os.path.relpath(out, REPO) if out.is_relative_to(REPO) else out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--sim", action="store_true", help="seeded Monte Carlo of step times")
    mode.add_argument("--real", action="store_true", help="real launches of r3-mini on this host")
    mode.add_argument("--merge", type=Path, nargs="+", metavar="JSON",
                      help="decisions over the streams of several --real figures files of one device (to --out)")
    ap.add_argument("--out", type=Path, default=None, help="figures file (JSON)")
    ap.add_argument("--sequences", type=int, default=10_000, help="--sim: sequences per scenario")
    ap.add_argument("--seed", type=int, default=26, help="--sim: seed of the first scenario (then +1 each)")
    ap.add_argument("--check", type=int, default=100,
                    help="--sim: sequences per scenario judged again by ledger/verdict's own functions")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="--real: the r3-mini protocol's device")
    ap.add_argument("--streams", type=int, default=1, help="--real: parallel streams, each on its own cores")
    ap.add_argument("--cores-per-stream", type=int, default=2, help="--real: cores pinned to each stream (taskset)")
    ap.add_argument("--budget-s", type=float, default=520.0, help="--real: start no work that would end later")
    ap.add_argument("--calibration-repeats", type=int, default=5, help="--real: A/A triplets of each calibration")
    ap.add_argument("--k1", action="store_true",
                    help="--real (issue 34): per stream `orch calibrate --repeats N` (N separate A/A launches), then "
                         "K = 1 launches each decided by its own audit; --kinds of null, noisy, steadier, order, "
                         "slow25, slow10 (stream i: the i-th; a slowdown's candidate sleeps that share of the A/A "
                         "median step)")
    ap.add_argument("--noise-sleep-s", type=float, default=0.1,
                    help="--real --k1, kind noisy: both arms sleep after each scheduler.step(), the baseline this "
                         "many seconds, the candidate uniform in [0, 2x] (same median step, noisier)")
    ap.add_argument("--order-sleep-s", type=float, default=0.1,
                    help="--real --k1, kind order (issue 52): the baseline's second launch (B) sleeps this many "
                         "seconds after each scheduler.step(), through a switch only the baseline arm names")
    ap.add_argument("--small", action="store_true", help="--real: shorter rollouts (as bench_null --small)")
    ap.add_argument("--kinds", default=None,
                    help="--real: comma list of null, slow25, slow10; with 3+ streams stream i runs the i-th "
                         "(cyclically), with fewer each stream cycles through them (default null,slow25,slow10)")
    opts = ap.parse_args()
    if opts.sim:
        run_sim(opts)
    elif opts.merge:
        from verdict_real import merge

        merge(opts.merge, opts.out or Path("bench_verdict_real_merged.json"), provenance())
    else:
        from verdict_real import run_real

        run_real(opts, provenance())


if __name__ == "__main__":
    main()
