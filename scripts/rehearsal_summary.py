"""Aggregate findings of one `orch rehearse` run, for docs/validation/ (no paths, names, images or traces).

Usage: python scripts/rehearsal_summary.py ORCH_HOME OUT_DIR  -> OUT_DIR/rehearsal_findings.json and a table
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _steps(pkg: Path) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = {}
    for f in sorted(pkg.glob("steps.rank*.jsonl")):
        rank = int(f.name.split(".rank")[1].split(".")[0])
        out[rank] = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    return out


def _leftovers() -> list[str]:
    """Names of processes still alive that a trainer may leave behind (wandb service, DataLoader workers, ranks)."""
    ps = subprocess.run(["ps", "-eo", "comm,args"], capture_output=True, text=True, check=False).stdout
    keys = ("wandb", "online_rl", "workers.probe", "torch.distributed.run", "pt_data_worker")
    return sorted({line.split()[0] for line in ps.splitlines()[1:] if any(k in line for k in keys)})


def summarize(home: Path) -> dict[str, Any]:
    runs = sorted((home / "runs").iterdir())
    run_dir = runs[-1]
    run = json.loads((run_dir / "run.json").read_text())
    audit_path = run_dir / "audit.json"
    audit = json.loads(audit_path.read_text()) if audit_path.is_file() else None
    arms: dict[str, Any] = {}
    for entry in run["packages"]:
        name = entry["name"]
        pkg = run_dir / "packages" / name
        row: dict[str, Any] = {"status": entry["status"], "wall_s": entry.get("wall_s")}
        if entry["kind"] == "train":
            steps = _steps(pkg)
            summaries = [json.loads(p.read_text()) for p in sorted(pkg.glob("probe.rank*.json"))]
            n = min(len(v) for v in steps.values()) if steps else 0
            if n:
                dur = [max(steps[r][k]["duration_s"] for r in steps) for k in range(n)]
                probe = [max(steps[r][k]["probe_s"] for r in steps) for k in range(n)]
                row.update(
                    steps=n, step0_s=round(dur[0], 3),
                    median_step_s_1_15=round(statistics.median(dur[1:]), 4) if n > 1 else None,
                    timed_steps_s=[round(d, 4) for d in dur[10:16]],
                    probe_s_median=round(statistics.median(probe), 5),
                    probe_fraction_timed=round(sum(probe[10:16]) / max(sum(dur[10:16]), 1e-12), 5) if n >= 16 else None,
                    forbidden=sorted({(f["op"], f["dtype"]) for r in steps.values() for s in r
                                      for f in s["forbidden"]}),
                    peak_allocated_gib=round(max((s.get("peak_allocated") or 0) for r in steps.values() for s in r)
                                             / 2**30, 3),
                )
            if summaries:
                rec = summaries[0].get("observed_recipe") or {}
                row.update(
                    other_optimizer_steps=sum(int(s.get("other_optimizer_steps") or 0) for s in summaries),
                    observed_recipe={k: rec.get(k) for k in ("optimizer", "lr", "betas", "eps", "weight_decay",
                                                              "max_grad_norm", "warmup_steps", "trainable_params",
                                                              "frozen_params", "layers")},
                    frozen_modules=len(rec.get("frozen") or []),
                )
            row["trainer_outputs"] = entry.get("trainer_outputs")
        arms[name] = row
    rehearsals = sorted((home / "rehearsals").glob("*/rehearsal.json"))
    reh = json.loads(rehearsals[-1].read_text()) if rehearsals else {}
    return {
        "schema": "orch.rehearsal-findings/1",
        "run_id": run["run_id"],
        "protocol_name": run["protocol_name"],
        "status": run["status"],
        "versions": {k: v for k, v in run["host"].items() if k in ("torch", "triton", "python", "cuda", "gpu_model",
                                                                     "gpu_count", "driver")},
        "verdict": audit.get("verdict") if audit else None,
        "exactness": audit.get("exactness") if audit else None,
        "packages": arms,
        "judge": reh.get("judge"),
        "model": reh.get("model"),
        "upstream_root": reh.get("upstream_root"),
        "leftover_processes_after_run": _leftovers(),
    }


def aggregate(doc: dict[str, Any]) -> dict[str, Any]:
    """Evidence is aggregate only: tensor names become a count, the judge's per-port counts one total per kind."""
    doc = json.loads(json.dumps(doc))
    model = doc.get("model") or {}
    if isinstance(model.get("all_zero_tensors"), list):
        model["all_zero_tensors"] = len(model["all_zero_tensors"])
    judge = doc.get("judge") or {}
    if isinstance(judge.get("counts"), dict):
        totals: dict[str, int] = {}
        for per_port in judge["counts"].values():
            for kind, n in (per_port or {}).items():
                totals[kind] = totals.get(kind, 0) + int(n)
        judge["servers"] = len(judge["counts"])
        judge["counts"] = dict(sorted(totals.items()))
    return doc


def main() -> int:
    home, out = Path(sys.argv[1]), Path(sys.argv[2])
    doc = aggregate(summarize(home))
    tag = os.environ.get("REHEARSAL_TAG")
    if tag:  # where the evidence came from: the orch commit (or date) the script was given, never a path or a host
        doc["provenance"] = {
            "command": "bash scripts/rehearse_h200.sh (REHEARSE_TIMEOUT=1750 COMPILE_CACHE=<device disk>)",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "device": os.environ.get("REHEARSAL_DEVICE", "one NVIDIA H200 (lent)"),
            "orch_commit": tag,
        }
    (out / "rehearsal_findings.json").write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"run {doc['run_id']}: {doc['status']}, verdict {doc['verdict']}")
    print(f"{'package':<10} {'status':<8} {'wall s':>8} {'step0 s':>8} {'med s':>8} {'probe/step':>10} {'opt+':>5}")
    for name, row in doc["packages"].items():
        print(f"{name:<10} {row['status']:<8} {row.get('wall_s') or 0:>8.1f} {row.get('step0_s') or 0:>8.2f} "
              f"{row.get('median_step_s_1_15') or 0:>8.3f} {row.get('probe_fraction_timed') or 0:>10.4f} "
              f"{row.get('other_optimizer_steps', '-')!s:>5}")
    print("judge:", json.dumps(doc["judge"]))
    print("leftover processes:", doc["leftover_processes_after_run"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
