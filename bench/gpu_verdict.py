"""The verdict's acceptance on one GPU (issue 26), with the real CLI: `orch calibrate` of r3-mini's null protocol,
then `orch launch` at K = 1 of r3-mini's candidate (its fused paths on), of the null (candidate = baseline) and of a
known slowdown (the candidate sleeps a fraction of the calibrated baseline step in every step). The three protocols
share one baseline workload (protocol.schema.baseline_workload_id), so the one calibration serves all three.

Prints one table and writes the figures (JSON) to --out. Each launch is audited by orch itself; this script only
reads audit.json back.

Usage: python bench/gpu_verdict.py [--device cuda] [--calibration-repeats 3] [--slowdown 0.25] [--out FILE]
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

import yaml
from bench_null import baseline_step_s, env, null_protocol, orch, project, slowdown_protocol

REPO = Path(__file__).resolve().parents[1]
HEAD = {"git": "HEAD"}  # every arm not under test runs the committed tree


def candidate_protocol(proj: Path, device: str) -> Path:
    """r3-mini's own candidate (its fusion switches on), both arms from git HEAD."""
    src = "r3_mini_cuda1.yaml" if device == "cuda" else "r3_mini.yaml"
    data = yaml.safe_load((REPO / "protocol" / src).read_text())
    data["measurement"]["repeats"] = 1
    path = proj / "protocol" / "candidate_k1.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return with_git_arms(path)


def with_git_arms(path: Path) -> Path:
    data = yaml.safe_load(path.read_text())
    for arm in ("baseline", "candidate"):
        data["arms"][arm]["source"] = HEAD
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(proj: Path, *args: str) -> tuple[int, str, float]:
    """exit code, stdout's last line (--json: the one JSON document) then stderr, seconds."""
    t0 = time.monotonic()
    proc = subprocess.run(orch(*args), cwd=proj, env=env(), capture_output=True, text=True)
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    return proc.returncode, last + "\n" + proc.stderr, time.monotonic() - t0


def audit_of(home: Path, output: str) -> dict[str, Any] | None:
    try:
        run_id = json.loads(output.splitlines()[0])["run_id"]
    except (IndexError, ValueError, KeyError):
        return None
    path = home / "runs" / run_id / "audit.json"
    return json.loads(path.read_text()) if path.is_file() else None


def row(kind: str, audit: dict[str, Any], wall: float, code: int) -> dict[str, Any]:
    iv = audit["interval"]
    return {
        "kind": kind, "run_id": audit["run_id"], "exit_code": code, "wall_s": round(wall, 1),
        "triplets": iv["triplets"], "headlines": iv["headlines"], "estimate": iv["estimate"], "low": iv["low"],
        "high": iv["high"], "level": iv["level"], "df": iv["df"], "sd": iv["sd"],
        "variance_source": iv["variance_source"], "calibration_used": iv["calibration_used"],
        "verdict": audit["verdict"], "direction": audit.get("direction"), "exact": audit.get("exact"),
        "reasons": audit.get("reasons", [])[:3], "calibration_words": audit.get("calibration", {}).get("words"),
        "host_watch": (audit.get("host_watch") or {}).get("words"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--calibration-repeats", type=int, default=3)
    ap.add_argument("--slowdown", type=float, default=0.25, help="candidate sleep, fraction of the baseline step")
    ap.add_argument("--out", type=Path, default=Path("gpu_verdict.json"))
    opts = ap.parse_args()
    rows: list[dict[str, Any]] = []
    figures: dict[str, Any] = {"device": opts.device, "calibration_repeats": opts.calibration_repeats, "rows": rows}

    def save() -> None:
        opts.out.write_text(json.dumps(figures, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="orch-gpu-verdict-") as tmp:
        proj = project(Path(tmp))
        home = Path(tmp) / "home"
        common = ("--home", str(home), "--lock-dir", str(home / "locks"))
        null = with_git_arms(null_protocol(proj, opts.device, 1, small=False))
        code, out, wall = run(proj, "calibrate", str(null), "--repeats", str(opts.calibration_repeats), "--json",
                              *common)
        print(f"orch calibrate ({opts.calibration_repeats} A/A launches): exit {code}, {wall:.0f} s", flush=True)
        cal = audit_of(home, out)
        figures["calibration"] = {"exit_code": code, "wall_s": round(wall, 1), "tail": out[-1500:] if code else None}
        if cal is None:
            print(out[-3000:])
            save()
            return 1
        step = baseline_step_s(cal)
        recorded = json.loads(out.splitlines()[0]).get("calibration") or {}  # orch.calibration/2 as recorded
        figures["calibration"].update({"run_id": cal["run_id"], "run_ids": recorded.get("run_ids"),
                                       "sd": recorded.get("sd"), "df": recorded.get("df"), "baseline_step_s": step,
                                       "headlines": recorded.get("headlines")})
        save()
        plan = [("candidate", candidate_protocol(proj, opts.device)), ("null", null)]
        for kind, protocol in plan:
            code, out, wall = run(proj, "launch", str(protocol), "--json", *common)
            audit = audit_of(home, out)
            print(f"orch launch {kind} (K = 1): exit {code}, {wall:.0f} s", flush=True)
            if audit is None:
                print(out[-3000:])
                figures.setdefault("failed", []).append({"kind": kind, "exit_code": code, "tail": out[-1500:]})
            else:
                rows.append(row(kind, audit, wall, code))
            save()
        slow = slowdown_protocol(proj, null, 1, opts.slowdown * step)
        code, out, wall = run(proj, "launch", str(slow), "--json", *common)
        audit = audit_of(home, out)
        print(f"orch launch slowdown (K = 1, sleep {opts.slowdown * step:.4f} s): exit {code}, {wall:.0f} s")
        if audit is None:
            print(out[-3000:])
        else:
            rows.append(row(f"slowdown {opts.slowdown:.0%}", audit, wall, code))
        save()
    print("\nkind | K | headline | speedup [95%] | df | variance | verdict | wall s")
    for r in rows:
        low = "0" if r["low"] is None else f"{r['low']:.4f}"
        high = "inf" if r["high"] is None else f"{r['high']:.4f}"
        verdict = r["verdict"] + (f" ({r['direction']})" if r["direction"] else "")
        print(f"{r['kind']} | {r['triplets']} | {' / '.join(f'{h:.4f}' for h in r['headlines'])} | "
              f"{r['estimate']:.4f} [{low}, {high}] | {r['df']} | {r['variance_source']} | {verdict} | "
              f"{r['wall_s']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
