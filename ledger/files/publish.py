"""`orch publish RUN_ID --to docs/validation/NAME.json`: the aggregate evidence of one audited run.

Figures, digests, commitment roots, versions and the ledger head only; refused when it fails hygiene.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.console import Console

from ledger.cost.store import Ledger
from ledger.cost.witness import EVIDENCE_DIR, ledger_id, record_head, repository_root
from ledger.files.hygiene import scan_bytes, this_host_names
from protocol.errors import RefusedError, UsageError
from protocol.fileio import write_atomic
from protocol.hashing import canonical_json
from protocol.home import resolve_home
from protocol.plan import ROLES

EVIDENCE_SCHEMA = "orch.evidence/1"


def evidence_document(audit: Mapping[str, Any], audit_sha256: str, ledger_id: str | None = None) -> dict[str, Any]:
    """Aggregate evidence from an audit document: nothing per tensor, per file or per sample.

    `ledger_id` names the ledger whose head this is, so that `orch audit` can check that ledger against it."""
    sp = audit["speedup"]
    ex = audit["exactness"]
    mem = audit["memory"]
    at = audit["attribution"]
    fm = ex["first_mismatch"]
    return {
        "schema": EVIDENCE_SCHEMA,
        "run_id": audit["run_id"],
        "protocol_id": audit["protocol_id"],
        "protocol_name": audit["protocol_name"],
        "audit_sha256": audit_sha256,
        "audited_at": audit["audited_at"],
        "verdict": audit["verdict"],
        "scope": audit["scope"],
        "precision": audit["precision"],
        "measurement": audit["measurement"],
        "commitment_roots": at["commitment_roots"],
        "attribution": {
            "label": at["label"],
            "training_code_only": at["training_code_only"],
            "differs": at["differs"],
            "switches": at["switches"],
            "config_keys": sorted(at["config"]),
        },
        "versions": audit["versions"],
        "host_hash": audit["host_hash"],
        "windows": [
            {
                "name": w["name"],
                "steps": w["steps"],
                "A": w["A"],
                "C": w["C"],
                "B": w["B"],
                "cv": w["cv"],
                "ratio": w["ratio"],
                "drift": w["drift"],
                "within_noise": w["within_noise"],
            }
            for w in sp["windows"]
        ],
        "headline": sp["headline"],
        "headline_window": sp["headline_window"],
        "direction": audit.get("direction"),
        "interval": audit.get("interval"),
        "replication": audit.get("replication"),
        "diagnostics": audit.get("diagnostics"),
        "clock": (audit.get("clock") or {}).get("words"),
        "max_drift": sp["max_drift"],
        "drift_bound": sp["drift_bound"],
        "noisy": sp["noisy"],
        "exactness": {
            "exact": ex["exact"],
            "ranks": ex["ranks"],
            "digest_steps": ex["digest_steps"],
            "tensors_compared": ex["tensors_compared"],
            "mismatches": ex["mismatches"],
            "first_mismatch": None
            if fm is None
            else {"check": fm["check"], "step": fm["step"], "rank": fm["rank"], "tensor": fm["tensor"]},
            "reload_equal": ex["reload_equal"],
            "rng_equal": ex["rng_equal"],
            "recipe_equal": ex["recipe_equal"],
            "forbidden_ops": len(ex["forbidden"]),
        },
        "memory": {
            "device": mem["device"],
            "peaks": [
                {
                    "rank": r["rank"],
                    **{label: r[label] for label in ROLES},
                    "delta_allocated": r["delta_allocated"],
                    "delta_reserved": r["delta_reserved"],
                }
                for r in mem["ranks"]
            ],
            "max_delta_allocated": mem["max_delta_allocated"],
            "max_delta_reserved": mem["max_delta_reserved"],
        },
        **({} if "compile_cache" not in audit else {"compile_cache": _compile_cache(audit["compile_cache"])}),
        "gpu_seconds": audit["cost"]["gpu_seconds"],
        "total_gpu_seconds": audit["cost"]["total_gpu_seconds"],
        "ledger_head": audit["ledger_head"],
        "ledger_id": ledger_id,
    }


def _compile_cache(cc: Mapping[str, Any]) -> dict[str, Any]:
    """The compile caches in aggregate: counts and digests per launch, the kernels a launch tuned itself by name."""
    if cc.get("mode") == "none":  # no prime: the packages orch found compiling nothing
        return dict(cc)
    return {
        "baseline": cc["baseline"],
        "same_baseline_picks": cc["same_baseline_picks"],
        "differing_baseline_picks": cc["differing_baseline_picks"],
        "prime_gpu_seconds": cc["prime_gpu_seconds"],
        "prime_share": cc["prime_share"],
        "launches": {name: {k: v for k, v in use.items() if k != "own_kernels"}
                     | {"own_kernels": sorted({k["kernel"] for k in use["own_kernels"]})}
                     for name, use in cc["launches"].items()},
        "diagnosis": cc["diagnosis"],
    }


def evidence_path(to: Path, repo: Path | None) -> Path:
    """`to` made absolute, when it lies inside the repository's docs/validation/ (UsageError otherwise)."""
    if to.suffix != ".json":
        raise UsageError(f"--to {to}: evidence is a JSON file; give a path like docs/validation/NAME.json")
    if repo is None:
        raise UsageError("publish writes only into a repository's docs/validation/ and no repository (.git) "
                         "encloses the current directory; run it inside the repository")
    allowed = repo.resolve().joinpath(*EVIDENCE_DIR)
    target = to.resolve()
    if not target.is_relative_to(allowed) or target == allowed:
        raise UsageError(f"--to {to}: evidence is published only inside {'/'.join(EVIDENCE_DIR)}/ of the "
                         "repository; give a path like docs/validation/NAME.json")
    return target


def publish_run(home: Path | None, run_id: str, to: Path, repo: Path | None = None) -> Path:
    """Write the evidence of an audited run to `to` atomically, after it passes hygiene; return the path.

    `to` must lie in `repo`'s docs/validation/ (default: the repository enclosing the current directory).
    """
    repo = repository_root(Path.cwd()) if repo is None else repo
    to = evidence_path(to, repo)
    h = resolve_home(home)
    run_dir = h.run_dir(run_id)
    audit_path = run_dir / "audit.json"
    if not audit_path.is_file():
        raise RefusedError(f"run {run_id} has no audit; run `orch audit {run_id}` on a complete run first")
    data = audit_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    recorded = [
        r
        for r in Ledger(h.ledger_path).records()
        if r.run_id == run_id and r.kind == "audit" and r.result_digest == digest
    ]
    if not recorded:
        raise RefusedError(
            f"run {run_id}: audit.json is not the audit recorded in the ledger; re-run `orch audit {run_id}`"
        )
    ledger = Ledger(h.ledger_path)
    doc = evidence_document(json.loads(data), digest, ledger_id(ledger))
    text = canonical_json(doc, ensure_ascii=False, pretty=True).encode()
    findings = scan_bytes(str(to), text, this_host_names())
    if findings:
        for f in findings:
            Console(highlight=False, soft_wrap=True).print(f.text(), markup=False)
        raise RefusedError(
            f"publish: the evidence of run {run_id} fails hygiene ({len(findings)} finding(s)); not written"
        )
    if to.exists() and to.read_bytes() != text:
        raise RefusedError(f"{to} exists with other evidence; published evidence is never rewritten: choose a new name")
    to.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(to, text)
    assert repo is not None
    record_head(h, ledger, f"publish {run_id} {to.relative_to(repo.resolve())}")
    return to


def publish_command(run_id: str, to: Path, home: Path | None) -> dict[str, Any]:
    """`orch publish RUN_ID --to PATH [--home]`; returns where the evidence went."""
    path = publish_run(home, run_id, to)
    Console(highlight=False, soft_wrap=True).print(f"published evidence of run {run_id}: {path}", markup=False)
    return {"run_id": run_id, "path": str(path)}
