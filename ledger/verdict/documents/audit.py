"""`orch audit RUN_ID`: the verdict of one complete run, written once, before the blinded DEV score is read.

An incomplete or unverifiable run gets no audit: the audit lists what is missing, writes nothing, shows no score.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console

from ledger.cost.record import LedgerRecord
from ledger.cost.store import Ledger
from ledger.cost.witness import check_witnessed, record_head, repository_root
from ledger.verdict.decide.calibration import find_calibration
from ledger.verdict.decide.decision import exit_code
from ledger.verdict.decide.evidence import IncompleteRunError, RunEvidence, collect_evidence
from ledger.verdict.decide.integrity import verify_integrity
from ledger.verdict.documents.document import (
    ADDED_LATER,
    AUDIT_UNITS,
    AUDIT_V1,
    STATISTICS_KEYS,
    STATISTICS_RULES,
    AuditResult,
    DevScore,
    canonical_bytes,
    compute_audit,
    evidence_part,
)
from ledger.verdict.documents.interval_doc import audit_note
from ledger.verdict.documents.report import plot_step_times, render_markdown, render_terminal
from protocol.errors import FailedError
from protocol.fileio import write_atomic
from protocol.home import resolve_home
from protocol.schema import baseline_workload_id

MIX_REFUSAL = (
    "the audit reads one run's packages only: ratios from different runs, hosts, GPU counts or configurations "
    "are never multiplied or mixed (the owner's rule); audit each run on its own"
)


# Python 3.12's sum() of floats is compensated and 3.11's is not: an audit recorded under one and recomputed under the
# other differs in the last bits of a total. Numbers agree when they differ by no more than rounding (relative 1e-10);
# a changed figure of the evidence (a step time, a GPU-second) moves them far beyond these tolerances.
FLOAT_REL_TOL = 1e-10
FLOAT_ABS_TOL = 1e-12


def _same(a: Any, b: Any) -> bool:
    """Recorded and recomputed values agree: equal structure, equal strings, flags and None, numbers equal up to
    rounding."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(a[i], b[i]) for i in range(len(a)))
    return bool(a == b)


def _differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if not _same(a.get(k), b.get(k)))


def unseal_score(ev: RunEvidence) -> DevScore | None:
    """Read the sealed DEV metrics, only after the audit is recorded, checking them against the ledger; None for an
    A/A launch of `orch calibrate`, which runs no scorer."""
    close = ev.closes.get("score")
    if close is None:
        return None
    path = ev.run_dir / "score.sealed.json"
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = close.result_digest
    if digest != expected:
        return DevScore(digest, False, None, "score.sealed.json does not match the ledger's digest; not shown")
    try:
        metrics: Any = json.loads(data)
    except ValueError:
        metrics = data.decode("utf-8", errors="replace")
    return DevScore(digest, True, metrics, "informational: not part of the verdict, never published")


def _append_audit_record(
    ledger: Ledger, ev: RunEvidence, doc: Mapping[str, Any], digest: str, started: float
) -> LedgerRecord:
    now = time.time()
    # host is left to the ledger: the salted hash of the host that audited
    return ledger.append(
        run_id=ev.run_id,
        package="audit",
        kind="audit",
        arm=None,
        status=doc["verdict"],  # the audit package's status is its verdict
        started=datetime.fromtimestamp(started, UTC),
        ended=datetime.fromtimestamp(now, UTC),
        wall_s=now - started,
        gpus=0,
        gpu_seconds=0.0,
        lock_wait_s=0.0,
        protocol_id=ev.run.protocol_id,
        sources_root=doc["attribution"]["commitment_roots"].get("candidate"),
        result_digest=digest,
        exit_code=exit_code(doc["verdict"]),
        note=audit_note(doc),
    )


def audit_run(home: Path | None, run_id: str) -> AuditResult:
    """Audit one run: verify, compute, write audit.json/audit.md/plot, record in the ledger, then unseal."""
    started = time.time()
    h = resolve_home(home)
    ev = collect_evidence(h, run_id)
    ledger = Ledger(h.ledger_path)
    # a forged run re-appended with orch's own code verifies on its own: only heads seen before can refuse it
    check_witnessed(h, ledger, repository_root(Path.cwd()), run_id)
    problems = verify_integrity(ev, ledger)
    if problems:
        raise IncompleteRunError(
            f"run {run_id}: the evidence does not verify ({len(problems)} problem(s)); no audit was written "
            "and no score is shown; the run directory or ledger was altered",
            problems,
        )
    tree_head = ledger.head()
    first_seq = min((r.seq for r in ev.records), default=None)
    calibration = find_calibration(h.runs, ledger.records(), ev.run.protocol_id, ev.run.host.model_dump(), first_seq,
                                   baseline_workload_id(ev.protocol), ev.protocol.measurement.calibration_max_age_days)
    doc = compute_audit(ev, (tree_head.size, tree_head.root), datetime.now(UTC).isoformat(timespec="seconds"),
                        calibration)
    audit_path = ev.run_dir / "audit.json"
    md_path = ev.run_dir / "audit.md"
    plot_path = ev.run_dir / "step_times.png"
    notes: list[str] = []
    written = True
    if audit_path.exists():
        existing = json.loads(audit_path.read_bytes())
        # an audit recorded before paired statistics is compared on the parts whose computation did not change
        # ... and so is one recorded under earlier statistics rules (before STATISTICS_RULES)
        earlier = existing.get("schema") == AUDIT_V1 or existing.get("statistics_rules") != STATISTICS_RULES
        skip = STATISTICS_KEYS if earlier else ()
        fresh = {k: v for k, v in evidence_part(doc).items()
                 if k not in skip and (k in existing or k not in ADDED_LATER)}
        differ = _differing_keys({k: v for k, v in evidence_part(existing).items() if k not in skip}, fresh)
        if differ:
            raise FailedError(
                f"run {run_id}: the recorded audit.json differs from a recomputation in {', '.join(differ)}; "
                "recorded evidence is never rewritten: find out what changed in the run directory"
            )
        doc = existing
        written = False
        if skip:
            when = (f"as {AUDIT_V1}, before paired statistics" if existing.get("schema") == AUDIT_V1 else
                    f"under statistics rules before {STATISTICS_RULES}")
            busy = ", GPU-busy and its expected width" if "gpu_busy" in existing else ""
            notes.append(f"audit.json was recorded {when}: a recomputation equals it on every part but the "
                         "statistics (verdict, interval, per-triplet figures, calibration, reasons, "
                         f"diagnostics{busy}), which are shown as recorded")
        else:
            notes.append("audit.json was already recorded; the recomputation equals it, shown unchanged")
    data = canonical_bytes(doc) if written else audit_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if written:
        write_atomic(audit_path, data)
    if written or not md_path.exists():
        write_atomic(md_path, render_markdown(doc).encode())
    if written or not plot_path.exists():
        plot_step_times(doc, plot_path)
    recorded = [r for r in ledger.records(run_id) if r.kind == "audit" and r.result_digest == digest]
    if recorded:
        seq: int | None = recorded[-1].seq
    else:
        seq = _append_audit_record(ledger, ev, doc, digest, started).seq
        record_head(h, ledger, f"audit {run_id}")
    # only now, with the verdict recorded, may the DEV score be read
    score = unseal_score(ev)
    return AuditResult(run_id, doc, audit_path, md_path, plot_path, written, seq, score, notes)


def audit_command(run_id: str, home: Path | None) -> dict[str, Any]:
    """`orch audit RUN_ID [--home] [--json]`: the report of one run; returns the JSON document; exit 1
    when not exact (`ledger.verdict.decide.decision.exit_code`, the same as `orch launch`)."""
    console = Console(highlight=False, soft_wrap=True)
    try:
        result = audit_run(home, run_id)
    except IncompleteRunError as err:
        for problem in err.problems:
            console.print(f"missing or failed: {problem}", markup=False)
        err.document = {"run_id": run_id, "audit": None, "problems": err.problems}
        raise
    render_terminal(result, console)
    out: dict[str, Any] = {"audit": result.document, "written": result.written, "ledger_seq": result.ledger_seq,
                           "exit_code": exit_code(result.verdict), "units": AUDIT_UNITS}
    if result.score is not None:
        out["dev_score"] = {
            "informational": True,
            "verified": result.score.verified,
            "sha256": result.score.sha256,
            "metrics": result.score.metrics,
        }
    if result.score is not None and not result.score.verified:
        raise FailedError(f"run {result.run_id}: {result.score.detail}", document=out)
    if exit_code(result.verdict) != 0:
        reason = result.document["reasons"][0] if result.document["reasons"] else result.verdict
        raise FailedError(f"run {result.run_id}: audit verdict {result.verdict}: {reason}", document=out)
    return out
