"""The proof overhead of each run, from the ledger alone (issue 51): the GPU-seconds of its timed launches (the train
packages: A, C, B of every triplet) against everything else it spent proving them (checks, prime, reloads, the
watched replay, score), and their share. `orch ledger overhead`; bench/bench_proof.py prints the same."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ledger.cost.record import LedgerRecord

TIMED = "train"
PROOF_KINDS = ("checks", "prime", "reload", "replay", "score")  # what a run spends beyond its timed launches


def run_overheads(records: Iterable[LedgerRecord], run_ids: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """One row per run (in ledger order): timed and proof GPU-seconds, the proof's share of the run, the run as a
    multiple of its timed launches, and the proof by kind. Only closed records count (an open one has no figure)."""
    wanted = None if run_ids is None else set(run_ids)
    rows: dict[str, dict[str, Any]] = {}
    for rec in records:
        if rec.status == "open" or rec.kind not in (TIMED, *PROOF_KINDS):
            continue
        if wanted is not None and rec.run_id not in wanted:
            continue
        row = rows.setdefault(rec.run_id, {"run_id": rec.run_id, "timed_gpu_seconds": 0.0, "by_kind": {},
                                           "timed_wall_s": 0.0, "proof_wall_s": 0.0, "packages": 0})
        gs = float(rec.gpu_seconds or 0.0)
        row["packages"] += 1
        if rec.kind == TIMED:
            row["timed_gpu_seconds"] += gs
            row["timed_wall_s"] += float(rec.wall_s or 0.0)
        else:
            row["by_kind"][rec.kind] = row["by_kind"].get(rec.kind, 0.0) + gs
            row["proof_wall_s"] += float(rec.wall_s or 0.0)
    out = []
    for row in rows.values():
        timed = row["timed_gpu_seconds"]
        proof = sum(row["by_kind"].values())
        total = timed + proof
        wall = row["timed_wall_s"] + row["proof_wall_s"]
        out.append({**row, "proof_gpu_seconds": proof, "total_gpu_seconds": total,
                    "proof_share": proof / total if total else 0.0, "of_timed": total / timed if timed else None,
                    "proof_wall_share": row["proof_wall_s"] / wall if wall else 0.0})
    return out


def overhead_total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The rows together (e.g. a calibration's A/A launches and the run it calibrates)."""
    timed = sum(r["timed_gpu_seconds"] for r in rows)
    proof = sum(r["proof_gpu_seconds"] for r in rows)
    total = timed + proof
    tw, pw = sum(r["timed_wall_s"] for r in rows), sum(r["proof_wall_s"] for r in rows)
    return {"runs": len(rows), "timed_gpu_seconds": timed, "proof_gpu_seconds": proof, "total_gpu_seconds": total,
            "proof_share": proof / total if total else 0.0, "of_timed": total / timed if timed else None,
            "timed_wall_s": tw, "proof_wall_s": pw, "proof_wall_share": pw / (tw + pw) if tw + pw else 0.0}


def overhead_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per run and one for them all: what the timed launches took, what proving them took beyond."""
    lines = []
    for r in [*rows, {**overhead_total(rows), "run_id": f"all {len(rows)} run(s)", "by_kind": {}}]:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["by_kind"].items()))
        times = "n/a" if r["of_timed"] is None else f"{r['of_timed']:.2f}x"
        if r["total_gpu_seconds"] == 0 and "timed_wall_s" in r:  # a CPU protocol holds no GPU: its wall seconds
            lines.append(f"{r['run_id']}: no GPU-seconds (a CPU protocol); wall: timed {r['timed_wall_s']:.1f} s, "
                         f"proof beyond them {r['proof_wall_s']:.1f} s ({100 * r['proof_wall_share']:.1f}%)")
            continue
        lines.append(f"{r['run_id']}: timed {r['timed_gpu_seconds']:.1f} GPU-s, proof beyond them "
                     f"{r['proof_gpu_seconds']:.1f} GPU-s ({100 * r['proof_share']:.1f}% of "
                     f"{r['total_gpu_seconds']:.1f}; the run is {times} its timed launches)"
                     + (f": {kinds}" if kinds else ""))
    return lines
