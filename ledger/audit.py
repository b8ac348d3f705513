"""`orch audit RUN_ID`: the verdict of one complete run, written once, before the blinded DEV score is read.

An incomplete or unverifiable run gets no audit: the audit lists what is missing, writes nothing, shows no score.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from rich.console import Console

from ledger.calibration import find_calibration
from ledger.exactness import Exactness, Mismatch, exactness
from ledger.host_report import clock_doc, quiet_host_doc
from ledger.record import LedgerRecord
from ledger.store import Ledger
from ledger.verdict import (
    decide,
    drift_notes,
    exit_code,
    interval_doc,
    replication_doc,
    run_interval,
    triplet_speedups,
)
from ledger.windows import Speedup, step_times
from ledger.witness import check_witnessed, record_head, repository_root
from manifests.core import diff_manifests, hash_tree, load_manifest
from protocol.errors import FailedError, OrchError, UsageError
from protocol.hashing import canonical_json, sha256_file
from protocol.home import Home, resolve_home
from protocol.plan import ARMS, BASELINE_ROLES, KINDS, ROLES, launch_labels, package_names, replay_label, triplets
from protocol.results import ChecksResult, ReloadResult, ScoreResult, StepRecord, TrainResult
from protocol.schema import Protocol

AUDIT_SCHEMA = "orch.audit/1"
PACKAGES = package_names(1)  # the owner's run; with measurement.repeats K the plan lists package_names(K)
RUN_SCHEMA = "orch.run/2"
VOLATILE_KEYS = ("audited_at", "ledger_head")  # may differ between two audits of the same evidence
M = TypeVar("M", bound=BaseModel)
# the units of audit.json's figures (also in `orch schema --kind audit`); its keys stay as recorded
AUDIT_UNITS = {
    "speedup.windows[].A|C|B": "s: the window's time, the SUM of its steps' times",
    "speedup.windows[].step_times, speedup.step_times": "s per step (max over ranks, probe work excluded)",
    "speedup.windows[].ratio|drift|cv|noise, speedup.headline": "unitless",
    "memory.ranks[].*, memory.max_delta_*": "bytes",
    "cost.gpu_seconds, cost.total_gpu_seconds": "GPU-seconds",
    "cost.wall_s, cost.total_wall_s, cost.lock_wait_s": "s",
}
MIX_REFUSAL = (
    "the audit reads one run's packages only: ratios from different runs, hosts, GPU counts or configurations "
    "are never multiplied or mixed (the owner's rule); audit each run on its own"
)


class IncompleteRunError(FailedError):
    """The run cannot be audited; `problems` says exactly what is missing or failed."""

    def __init__(self, message: str, problems: Sequence[str]) -> None:
        super().__init__(message)
        self.problems = list(problems)


@dataclass
class RunEvidence:
    """Everything the audit reads of one run, loaded and validated, nothing computed yet."""

    run_id: str
    run_dir: Path
    run: dict[str, Any]
    protocol: Protocol
    protocol_sha256: str
    checks: ChecksResult
    trains: dict[str, TrainResult]
    reloads: dict[str, ReloadResult]
    score: ScoreResult
    steps: dict[str, dict[int, list[StepRecord]]]
    watch: TrainResult  # watch-C: the untimed replay of arm C with the forbidden-dtype watch on every step
    watch_steps: dict[int, list[StepRecord]]
    records: list[LedgerRecord]  # this run's ledger records, in ledger order
    closes: dict[str, LedgerRecord]  # package -> its close record
    result_sha256: dict[str, str]  # package -> sha256 of its result.json bytes
    names: tuple[str, ...] = PACKAGES  # the plan's packages

    @property
    def repeats(self) -> int:
        return self.protocol.measurement.repeats


@dataclass(frozen=True)
class DevScore:
    """The unsealed DEV metrics: informational, never part of the verdict or of published evidence."""

    sha256: str
    verified: bool
    metrics: Any
    detail: str


@dataclass
class AuditResult:
    run_id: str
    document: dict[str, Any]
    audit_path: Path
    markdown_path: Path
    plot_path: Path
    written: bool  # False when an equal audit.json was already there
    ledger_seq: int | None
    score: DevScore | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        return str(self.document["verdict"])


def _first_error(err: ValidationError) -> str:
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "document"
    return f"{loc}: {e['msg']}"


def _load_model(model: type[M], path: Path, problems: list[str], rel: str) -> M | None:
    if not path.is_file():
        problems.append(f"{rel}: missing")
        return None
    try:
        return model.model_validate_json(path.read_bytes())
    except ValidationError as err:
        problems.append(f"{rel}: malformed ({_first_error(err)})")
    except OSError as err:
        problems.append(f"{rel}: unreadable ({err.strerror})")
    return None


def _package_problems(
    run: Mapping[str, Any], records: Sequence[LedgerRecord], names: Sequence[str] = PACKAGES
) -> tuple[list[str], dict[str, LedgerRecord], set[str]]:
    """One line per package that is not ok, from the ledger (authoritative) and run.json; and the close records.

    Every package needs one open and one ok close record; a lone open record means a crash or a live run.
    """
    problems: list[str] = []
    closes: dict[str, LedgerRecord] = {}
    opens: dict[str, int] = {}
    for rec in records:
        if rec.status == "open":
            opens[rec.package] = opens.get(rec.package, 0) + 1
        else:
            closes[rec.package] = rec
    declared = {p.get("name"): p for p in run.get("packages", []) if isinstance(p, dict)}
    bad: set[str] = set()
    for name in names:
        close, entry = closes.get(name), declared.get(name)
        line = None
        if opens.get(name, 0) and close is None:
            line = "open ledger record without a close (the run crashed or is still running)"
        elif close is None:
            line = "no ledger record"
        elif close.status != "ok":
            code = f" (exit {close.exit_code})" if close.exit_code is not None else ""
            line = f"{close.status}{code}" + (f": {close.note}" if close.note else "")
        elif run and entry is None:
            line = "ok in the ledger but absent from run.json"
        elif run and entry is not None and entry.get("status") != "ok":
            line = f"ok in the ledger but {entry.get('status')!r} in run.json"
        if line is not None:
            bad.add(name)
            problems.append(f"package {name}: {line}")
    return problems, closes, bad


def _read_steps(
    package_dir: Path, train: TrainResult, rel: str, n_steps: int, problems: list[str]
) -> dict[int, list[StepRecord]]:
    out: dict[int, list[StepRecord]] = {}
    for rank in train.ranks:
        path = package_dir / rank.steps_file
        where = f"{rel}/{rank.steps_file}"
        if not path.is_file():
            problems.append(f"{where}: missing")
            continue
        lines: list[StepRecord] = []
        for number, raw in enumerate(path.read_text().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                lines.append(StepRecord.model_validate_json(raw))
            except ValidationError as err:
                problems.append(f"{where}:{number}: malformed step line ({_first_error(err)})")
                break
        if sorted(r.step for r in lines) != list(range(n_steps)):
            problems.append(f"{where}: {len(lines)} step lines, expected steps 0-{n_steps - 1}")
        if any(r.rank != rank.rank for r in lines):
            problems.append(f"{where}: lines of another rank than {rank.rank}")
        out[rank.rank] = lines
    return out


def collect_evidence(home: Home, run_id: str) -> RunEvidence:
    """Load one run; raise IncompleteRunError naming every missing or failed piece (nothing is written)."""
    run_dir = home.run_dir(run_id)
    if not run_dir.is_dir():
        raise UsageError(f"no run {run_id!r} under {home.runs}; give a run id printed by `orch launch`")
    problems: list[str] = []
    run: dict[str, Any] = {}
    run_path = run_dir / "run.json"
    try:
        loaded = json.loads(run_path.read_text())
        if isinstance(loaded, dict) and loaded.get("schema") == "orch.run/1":
            # one line, before anything else: such a run has no watched replay and no trainer numbers to compare
            raise IncompleteRunError(
                f"run {run_id} is an orch.run/1 run, recorded before the watched replay (watch-C) and the trainer's "
                "own numbers were part of the evidence; it cannot be audited by this orch: relaunch the protocol",
                ["run.json: orch.run/1 (before watch-C and trainer scalars); relaunch the protocol"],
            )
        if not isinstance(loaded, dict) or loaded.get("schema") != RUN_SCHEMA:
            problems.append(f"run.json: not an {RUN_SCHEMA} document")
        else:
            run = loaded
    except FileNotFoundError:
        problems.append("run.json: missing (the launch never got past its start)")
    except (OSError, ValueError) as err:
        problems.append(f"run.json: malformed ({err})")
    if run:
        if run.get("run_id") != run_id:
            problems.append(f"run.json: run_id {run.get('run_id')!r} is not {run_id!r}")
        if run.get("status") != "complete":
            problems.append(f"run status is {run.get('status')!r}, not 'complete'")
    protocol: Protocol | None = None
    proto_path = run_dir / "protocol.json"
    protocol_sha = ""
    proto_problems: list[str] = []
    if proto_path.is_file():
        protocol_sha = sha256_file(proto_path)
        protocol = _load_model(Protocol, proto_path, proto_problems, "protocol.json")
    else:
        proto_problems.append("protocol.json: missing")
    repeats = protocol.measurement.repeats if protocol else 1
    names = package_names(repeats)
    records = Ledger(home.ledger_path).records(run_id)
    package_problems, closes, bad = _package_problems(run, records, names)
    problems += package_problems + proto_problems

    pkg_dir = run_dir / "packages"
    # a package already reported as not ok is not reported again for its missing result
    sink: list[str] = []

    def where(name: str) -> list[str]:
        return sink if name in bad else problems

    checks = _load_model(
        ChecksResult, pkg_dir / "checks" / "result.json", where("checks"), "packages/checks/result.json"
    )
    score = _load_model(ScoreResult, pkg_dir / "score" / "result.json", where("score"), "packages/score/result.json")
    trains: dict[str, TrainResult] = {}
    reloads: dict[str, ReloadResult] = {}
    steps: dict[str, dict[int, list[StepRecord]]] = {}
    n_steps = protocol.measurement.steps if protocol else 0
    for label in launch_labels(repeats):
        rel = f"packages/train-{label}"
        train = _load_model(TrainResult, run_dir / rel / "result.json", where(f"train-{label}"), f"{rel}/result.json")
        if train is not None:
            if train.arm != label:
                problems.append(f"{rel}/result.json: arm {train.arm!r}, expected {label!r}")
            trains[label] = train
            if protocol is not None:
                steps[label] = _read_steps(run_dir / rel, train, rel, n_steps, problems)
        rrel = f"packages/reload-{label}"
        reload = _load_model(
            ReloadResult, run_dir / rrel / "result.json", where(f"reload-{label}"), f"{rrel}/result.json"
        )
        if reload is not None:
            if reload.arm != label:
                problems.append(f"{rrel}/result.json: arm {reload.arm!r}, expected {label!r}")
            reloads[label] = reload
    watch_rel = "packages/watch-C"
    watch = _load_model(TrainResult, run_dir / watch_rel / "result.json", where("watch-C"), f"{watch_rel}/result.json")
    watch_steps: dict[int, list[StepRecord]] = {}
    if watch is not None:
        if watch.arm != replay_label(repeats):
            problems.append(f"{watch_rel}/result.json: arm {watch.arm!r}, expected {replay_label(repeats)!r}")
        if protocol is not None:
            watch_steps = _read_steps(run_dir / watch_rel, watch, watch_rel, n_steps, problems)
    result_sha = {
        name: sha256_file(pkg_dir / name / "result.json")
        for name in names
        if (pkg_dir / name / "result.json").is_file()
    }
    if problems or bad or protocol is None or checks is None or score is None or watch is None:
        raise IncompleteRunError(
            f"run {run_id} is not complete ({len(problems)} problem(s)); no audit was written and no score "
            "is shown; relaunch the protocol for a complete run",
            problems,
        )
    return RunEvidence(
        run_id=run_id,
        run_dir=run_dir,
        run=run,
        protocol=protocol,
        protocol_sha256=protocol_sha,
        checks=checks,
        trains=trains,
        reloads=reloads,
        score=score,
        steps=steps,
        watch=watch,
        watch_steps=watch_steps,
        records=records,
        closes=closes,
        result_sha256=result_sha,
        names=names,
    )


def verify_integrity(ev: RunEvidence, ledger: Ledger) -> list[str]:
    """Seals, commitments, protocol id, result digests and steps files against run.json and the ledger."""
    problems: list[str] = []
    report = ledger.verify()
    if not report.ok:
        problems.append(f"{report.message}; run `orch ledger verify` for details")
    if ev.protocol_sha256 != ev.run.get("protocol_id"):
        problems.append("protocol.json: its sha256 is not run.json's protocol_id (the protocol copy was altered)")
    arms = ev.run.get("arms", {})
    for arm in ARMS:
        info = arms.get(arm) if isinstance(arms, dict) else None
        if not isinstance(info, dict):
            problems.append(f"run.json: no arms.{arm}")
            continue
        sealed = ev.run_dir / "sealed" / arm
        try:
            # the seal covers the whole copy; the commitment covers the protocol's included sources
            manifest = load_manifest(ev.run_dir / "sealed" / f"{arm}.manifest.json")
            actual = hash_tree(sealed, manifest.include)
            sources = hash_tree(sealed, list(ev.protocol.sources.include))
        except OrchError as err:
            problems.append(f"seal of {arm}: {err.message}")
            continue
        if actual.root != manifest.root:
            diff = diff_manifests(manifest, actual)
            problems.append(f"seal of {arm}: sealed/{arm}/ no longer matches its manifest: {diff.summary()}")
        if info.get("sealed_root") != manifest.root:
            problems.append(f"seal of {arm}: sealed/{arm}.manifest.json is not the seal recorded in run.json")
        if info.get("sources_root") != sources.root:
            problems.append(f"seal of {arm}: the sealed sources do not hash to run.json's sources_root")
        under_evaluation = getattr(ev.protocol.arms, arm).under_evaluation
        if info.get("commitment_root") != sources.root and not under_evaluation:
            problems.append(
                f"seal of {arm}: sealed sources {sources.root[:16]} are not the commitment "
                f"{str(info.get('commitment_root'))[:16]} and the arm is not declared under evaluation"
            )
    declared = {p.get("name"): p for p in ev.run.get("packages", []) if isinstance(p, dict)}
    for name in ev.names:
        close = ev.closes[name]
        actual_sha = ev.result_sha256.get(name)
        if name == "score":
            sealed_file = ev.run_dir / "score.sealed.json"
            # hashing the sealed bytes is not reading the metric: blinding holds
            sealed_sha = sha256_file(sealed_file) if sealed_file.is_file() else None
            if sealed_sha is None:
                problems.append("score.sealed.json: missing")
            elif sealed_sha != close.result_digest or ev.score.sealed_sha256 != close.result_digest:
                problems.append("score.sealed.json: its sha256 is not the ledger's result digest of score")
            allowed = {actual_sha, close.result_digest}
        else:
            if actual_sha != close.result_digest:
                problems.append(f"packages/{name}/result.json: sha256 is not the ledger's result digest")
            allowed = {actual_sha}
        declared_sha = declared.get(name, {}).get("result_sha256")
        if declared_sha is not None and declared_sha not in allowed:
            problems.append(f"run.json: result_sha256 of {name} is not the digest of its result")
    step_files = [(f"train-{label}", train) for label, train in ev.trains.items()] + [("watch-C", ev.watch)]
    for name, train in step_files:
        for rank in train.ranks:
            path = ev.run_dir / "packages" / name / rank.steps_file
            if sha256_file(path) != rank.steps_sha256:
                problems.append(f"packages/{name}/{rank.steps_file}: sha256 is not the one {name} reported")
    return problems


def _mismatch_doc(m: Mismatch | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "check": m.check,
        "step": m.step,
        "rank": m.rank,
        "tensor": m.tensor,
        "values": m.values,
        "text": m.line(),
    }


def _exactness_doc(ex: Exactness) -> dict[str, Any]:
    return {
        "exact": ex.exact,
        "ranks": ex.ranks,
        "digest_steps": [ex.digest_first, ex.digest_last],
        "steps_compared": ex.steps_compared,
        "tensors_compared": ex.tensors_compared,
        "mismatches": ex.mismatches,
        "first_mismatch": _mismatch_doc(ex.first_mismatch),
        "reload_equal": ex.reload_ok,
        "rng_equal": ex.rng_equal,
        "rng_first_mismatch": _mismatch_doc(ex.rng_first_mismatch),
        "recipe_equal": ex.recipe_ok,
        "recipe_differences": ex.recipe_differences,
        "forbidden": [asdict(f) for f in ex.forbidden],
        "watch": {
            "watched_steps": ex.watched_steps,
            "passed_through": ex.watch_passed,
            "uninspected": ex.watch_uninspected,
        },
        "watch_coverage": ex.watch_coverage,
        "replay_equal": ex.replay_ok,
        "replay_first_mismatch": _mismatch_doc(ex.replay_first_mismatch),
        "scalars_equal": ex.scalars_equal,
        "scalar_steps": list(ex.scalar_steps),
        "scalars_compared": ex.scalars_compared,
        "scalars_first_mismatch": _mismatch_doc(ex.scalars_first_mismatch),
        "problems": ex.problems,
    }


def _speedup_doc(sp: Speedup, times: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """The owner's speedup of one triplet; times: role (A, C, B) -> step times."""
    return {
        "windows": [
            {
                "name": w.name,
                "steps": list(w.steps),
                "A": w.a,
                "C": w.c,
                "B": w.b,
                "step_times": {"A": list(w.a_steps), "C": list(w.c_steps), "B": list(w.b_steps)},
                "cv": {"A": w.cv_a, "C": w.cv_c, "B": w.cv_b},
                "ratio": w.ratio,
                "drift": w.drift,
                "noise": w.noise,
                "within_noise": w.within_noise,
                "words": w.words,
            }
            for w in sp.windows
        ],
        "headline": sp.headline,
        "headline_window": sp.headline_window,
        "max_drift": sp.max_drift,
        "drift_bound": sp.drift_bound,
        "noisy": sp.noisy,
        "words": sp.words,
        "step_times": {label: list(times[label]) for label in ROLES},
    }


def _memory_doc(ev: RunEvidence, roles: Mapping[str, str]) -> dict[str, Any]:
    """Peaks of one triplet (roles: A, C, B -> its labels)."""
    ranks = sorted({r.rank for t in ev.trains.values() for r in t.ranks})
    rows: list[dict[str, Any]] = []
    for rank in ranks:
        row: dict[str, Any] = {"rank": rank}
        for label in ROLES:
            summary = next((r for r in ev.trains[roles[label]].ranks if r.rank == rank), None)
            row[label] = {
                "allocated": summary.peak_allocated if summary else None,
                "reserved": summary.peak_reserved if summary else None,
            }
        for kind in ("allocated", "reserved"):
            base = [row[label][kind] for label in BASELINE_ROLES]
            cand = row["C"][kind]
            # candidate minus the larger baseline peak: a positive delta is more memory
            row[f"delta_{kind}"] = cand - max(base) if cand is not None and None not in base else None
        rows.append(row)
    deltas = {
        kind: [r[f"delta_{kind}"] for r in rows if r[f"delta_{kind}"] is not None] for kind in ("allocated", "reserved")
    }
    return {
        "device": ev.trains[roles["A"]].device,
        "measured": bool(deltas["allocated"]),
        "ranks": rows,
        "max_delta_allocated": max(deltas["allocated"]) if deltas["allocated"] else None,
        "max_delta_reserved": max(deltas["reserved"]) if deltas["reserved"] else None,
    }


def _cost_doc(ev: RunEvidence) -> dict[str, Any]:
    by_package = {name: float(ev.closes[name].gpu_seconds or 0.0) for name in ev.names}
    wall = {name: float(ev.closes[name].wall_s or 0.0) for name in ev.names}
    lock = ev.run.get("lock") if isinstance(ev.run.get("lock"), dict) else {}
    return {
        "gpu_seconds": by_package,
        "total_gpu_seconds": sum(by_package.values()),
        "wall_s": wall,
        "total_wall_s": sum(wall.values()),
        "lock_wait_s": (lock or {}).get("wait_s"),
    }


def _attribution_doc(ev: RunEvidence) -> dict[str, Any]:
    """What differs between the arms; 'training-code-only' only when nothing but code and switches differ."""
    arms = ev.run["arms"]
    b, c = arms["baseline"], arms["candidate"]
    b_sw, c_sw = dict(b.get("switches") or {}), dict(c.get("switches") or {})
    b_cf, c_cf = dict(b.get("config") or {}), dict(c.get("config") or {})
    switches = {
        k: {"baseline": b_sw.get(k), "candidate": c_sw.get(k)}
        for k in sorted(set(b_sw) | set(c_sw))
        if b_sw.get(k) != c_sw.get(k)
    }
    config = {
        k: {"baseline": b_cf.get(k), "candidate": c_cf.get(k)}
        for k in sorted(set(b_cf) | set(c_cf))
        if b_cf.get(k) != c_cf.get(k)
    }
    # what ran are the sealed sources (equal to the commitments unless under evaluation)
    sources_differ = b.get("sources_root") != c.get("sources_root")
    if config:
        label = "includes external configuration change: " + ", ".join(config)
    else:
        label = "training-code-only"
    differs = (
        (["sources"] if sources_differ else []) + (["switches"] if switches else []) + (["config"] if config else [])
    )
    return {
        "label": label,
        "training_code_only": not config,
        "differs": differs,
        "commitment_roots": {arm: arms[arm].get("commitment_root") for arm in ARMS},
        "sources_roots": {arm: arms[arm].get("sources_root") for arm in ARMS},
        "sealed_roots": {arm: arms[arm].get("sealed_root") for arm in ARMS},
        "sources_differ": sources_differ,
        "switches": switches,
        "config": config,
    }


def scope_sentence(first: int, last: int, ranks: int) -> str:
    return (
        f"deterministic steps {first}-{last} on {ranks} ranks; final parameter/Adam digests; "
        "not a measurement of full-training time or quality"
    )


def compute_audit(
    ev: RunEvidence, head: tuple[int, str], audited_at: str, calibration: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The audit document (orch.audit/1) of one verified, complete run; calibration: ledger.calibration's block."""
    m = ev.protocol.measurement
    labels = launch_labels(m.repeats)
    trips = triplets(m.repeats)
    times = {label: step_times(ev.steps[label], m.steps) for label in labels}
    sps = triplet_speedups(times, trips, steps=m.steps, warmup=m.warmup, window=m.window, drift_bound=m.drift_bound)
    first = trips[0].labels
    sp = sps[0]  # the owner's triplet: with repeats K it is the first of K, launched A -> C -> B
    ex = exactness(
        ev.steps,
        ev.trains,
        ev.reloads,
        ev.protocol.recipe.model_dump(),
        n_steps=m.steps,
        digest_first=m.digest_first,
        digest_last=m.digest_last,
        model=ev.protocol.model.model_dump() if ev.protocol.model is not None else None,
        watch=ev.watch,
        watch_steps=ev.watch_steps,
        labels=labels,
        replay_of=replay_label(m.repeats),
    )
    iv = run_interval(times, steps=m.steps, warmup=m.warmup, window=m.window)
    verdict, direction, sentence = decide(ex.exact, iv)
    reasons = list(ex.problems) if not ex.exact else ([] if verdict == "accepted" else [sentence])
    host = ev.run.get("host") if isinstance(ev.run.get("host"), dict) else {}
    return {
        "schema": AUDIT_SCHEMA,
        "run_id": ev.run_id,
        "protocol_id": ev.run["protocol_id"],
        "protocol_name": ev.protocol.name,
        "audited_at": audited_at,
        "verdict": verdict,
        "direction": direction,
        "verdict_words": sentence,
        "exact": ex.exact,
        "noisy": sp.noisy,
        "reasons": reasons,
        "diagnostics": drift_notes(trips, sps, m.drift_bound),
        "scope": scope_sentence(m.digest_first, m.digest_last, ex.ranks),
        "measurement": m.model_dump(exclude_unset=True),  # as recorded: fields added later stay out
        "precision": ev.protocol.precision,
        "speedup": _speedup_doc(sp, {role: times[label] for role, label in first.items()}),
        "interval": interval_doc(iv, m.repeats),
        "replication": replication_doc(trips, sps),
        "exactness": _exactness_doc(ex),
        "memory": _memory_doc(ev, first),
        "cost": _cost_doc(ev),
        "attribution": _attribution_doc(ev),
        "integrity": {
            "seals_verified": list(ARMS),
            "result_sha256": {name: ev.closes[name].result_digest for name in ev.names},
            "ledger_records": sum(1 for r in ev.records if r.kind in KINDS),
        },
        "versions": dict(ev.checks.versions),
        "host_hash": (host or {}).get("host_hash"),
        "calibration": calibration,
        "quiet_host": quiet_host_doc(ev.trains, labels),
        "clock": clock_doc(ev.trains, labels),
        "calibration_of": ev.run.get("calibration_of"),
        "ledger_head": {"size": head[0], "root": head[1]},
    }


def canonical_bytes(doc: Mapping[str, Any]) -> bytes:
    return canonical_json(doc, ensure_ascii=False, pretty=True).encode()


def evidence_part(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VOLATILE_KEYS}


def _differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it; a failed write leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def unseal_score(ev: RunEvidence) -> DevScore:
    """Read the sealed DEV metrics, only after the audit is recorded, checking them against the ledger."""
    path = ev.run_dir / "score.sealed.json"
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    expected = ev.closes["score"].result_digest
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
        protocol_id=ev.run.get("protocol_id"),
        sources_root=doc["attribution"]["commitment_roots"].get("candidate"),
        result_digest=digest,
        exit_code=exit_code(doc["verdict"]),
        note=f"verdict: {doc['verdict']}",
    )


def audit_run(home: Path | None, run_id: str) -> AuditResult:
    """Audit one run: verify, compute, write audit.json/audit.md/plot, record in the ledger, then unseal."""
    from ledger.report import plot_step_times, render_markdown

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
    host = ev.run.get("host") if isinstance(ev.run.get("host"), dict) else {}
    first_seq = min((r.seq for r in ev.records), default=None)
    calibration = find_calibration(h.runs, ledger.records(), str(ev.run.get("protocol_id")), host or {}, first_seq)
    doc = compute_audit(ev, (tree_head.size, tree_head.root), datetime.now(UTC).isoformat(timespec="seconds"),
                        calibration)
    audit_path = ev.run_dir / "audit.json"
    md_path = ev.run_dir / "audit.md"
    plot_path = ev.run_dir / "step_times.png"
    notes: list[str] = []
    written = True
    if audit_path.exists():
        existing = json.loads(audit_path.read_bytes())
        differ = _differing_keys(evidence_part(existing), evidence_part(doc))
        if differ:
            raise FailedError(
                f"run {run_id}: the recorded audit.json differs from a recomputation in {', '.join(differ)}; "
                "recorded evidence is never rewritten: find out what changed in the run directory"
            )
        doc = existing
        written = False
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
    when not exact (`ledger.verdict.exit_code`, the same as `orch launch`)."""
    from ledger.report import render_terminal

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
