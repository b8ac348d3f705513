"""A recorded run's verdict recomputed with the baseline's step profile (issue 50; ledger/verdict/decide/noise.py).

A calibration recorded before the profile existed has none, so its audits take the candidate's steps about their
mean. This reads the run's evidence and its calibration as `orch audit` finds them, takes the step profile from the
calibration's own A/A launches (their recorded audits, as `orch calibrate` now does), and computes the audit twice
in memory: as recorded (no profile) and with the profile. Nothing under the home is written.

    python bench/noise_profile.py --home HOME RUN_ID [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger.cost.store import Ledger
from ledger.verdict.decide.calibration import find_calibration
from ledger.verdict.decide.evidence import collect_evidence
from ledger.verdict.decide.noise import aa_step_profile
from ledger.verdict.documents.document import compute_audit
from orchestrator.run.calibrate import mean_profile
from protocol.home import resolve_home
from protocol.schema import baseline_workload_id


def profile_of(runs: Path, run_ids: list[str]) -> dict[str, Any]:
    """The step profile of these A/A launches, from their recorded audits."""
    got = []
    for rid in run_ids:
        audit = json.loads((runs / rid / "audit.json").read_bytes())
        one = aa_step_profile(audit.get("speedup") or {})
        if one is not None:
            got.append(one)
    steps, logs = mean_profile(got, len(run_ids))
    if steps is None or logs is None:
        raise SystemExit("noise_profile: the calibration's A/A launches give no common step profile")
    return {"profile_steps": steps, "step_profile": logs}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    iv = doc["interval"]
    noise = iv.get("noise") or {}
    return {"verdict": doc["verdict"], "direction": doc.get("direction"), "estimate": iv.get("estimate"),
            "low": iv.get("low"), "high": iv.get("high"), "half_width": iv.get("half_width"),
            "ratio_R": noise.get("ratio"), "applied": noise.get("applied"),
            "df": noise.get("df"), "p_value": noise.get("p_value"), "profile_fitted": bool(noise.get("profile_fitted"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_id")
    ap.add_argument("--home", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None, help="write both summaries here")
    args = ap.parse_args()
    home = resolve_home(args.home)
    ev = collect_evidence(home, args.run_id)
    ledger = Ledger(home.ledger_path)
    head = ledger.head()
    first_seq = min((r.seq for r in ev.records), default=None)
    block = find_calibration(home.runs, ledger.records(), ev.run.protocol_id, ev.run.host.model_dump(), first_seq,
                             baseline_workload_id(ev.protocol), ev.protocol.measurement.calibration_max_age_days)
    if not block.get("usable"):
        raise SystemExit(f"noise_profile: run {args.run_id} has no usable calibration: {block.get('words')}")
    plain = {k: v for k, v in block.items() if k not in ("profile_steps", "step_profile")}
    fitted = plain | profile_of(home.runs, list(block.get("run_ids") or [block["run_id"]]))
    when = "1970-01-01T00:00:00+00:00"
    out = {"run_id": args.run_id, "calibration_run_ids": block.get("run_ids"),
           "profile_steps": fitted["profile_steps"], "step_profile": fitted["step_profile"],
           "without_profile": summary(compute_audit(ev, (head.size, head.root), when, plain)),
           "with_profile": summary(compute_audit(ev, (head.size, head.root), when, fitted))}
    print("audit | verdict | speedup [95%] | half-width | R | F df | p")
    for key in ("without_profile", "with_profile"):
        s = out[key]
        verdict = s["verdict"] + (f" ({s['direction']})" if s["direction"] else "")
        print(f"{key.replace('_', ' ')} | {verdict} | {s['estimate']:.4f} [{s['low']:.4f}, {s['high']:.4f}] | "
              f"{s['half_width']:.2%} | {s['ratio_R']:.3g} | {s['df']} | {s['p_value']:.3g}")
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
