"""The audit document (orch.audit/2) of one verified, complete run, its canonical bytes, and the audit's result.

Pure: computed from the loaded evidence (ledger/verdict/decide/evidence.py); written and recorded by the command
(ledger/verdict/documents/audit.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ledger.probe_cost import probe_cost_doc
from ledger.verdict.decide.calibration import calibration_spreads, calibration_step_profile, calibration_step_spread
from ledger.verdict.decide.decision import (
    baseline_effects,
    decide,
    drift_notes,
    log_speedups,
    outlier_effects,
    outlier_notes,
    positions_doc,
    replication_doc,
    triplet_speedups,
    verdict_interval,
    window_effects,
    window_ratios,
)
from ledger.verdict.decide.evidence import RunEvidence
from ledger.verdict.decide.exactness import Exactness, exactness
from ledger.verdict.decide.gpu_busy import gpu_busy_doc
from ledger.verdict.decide.host_watch import busy_windows, host_watch_doc
from ledger.verdict.decide.mismatch import Mismatch
from ledger.verdict.decide.noise import NoiseEvidence, baseline_disagreement, baseline_outliers, triplet_arm_spread
from ledger.verdict.decide.recipe_check import recipe_doc
from ledger.verdict.decide.sequential_doc import run_rule, sequential_doc
from ledger.verdict.decide.stats import outlier_triplets, outlier_windows, window_spread
from ledger.verdict.decide.windows import Speedup, step_times
from ledger.verdict.documents.compile_cache_doc import compile_cache_doc
from ledger.verdict.documents.host_report import clock_doc, quiet_host_doc
from ledger.verdict.documents.interval_doc import interval_doc
from ledger.verdict.documents.isolation_doc import isolation_doc
from protocol.hashing import canonical_json
from protocol.plan import ARMS, BASELINE_ROLES, KINDS, ROLES, launch_labels, replay_label, triplets

AUDIT_SCHEMA = "orch.audit/2"  # /2: the paired per-triplet interval (decide/stats.py); /1 stays as recorded
AUDIT_V1 = "orch.audit/1"
# what /2 computes anew from the same evidence: a recorded /1 audit is compared with a recomputation on the rest
STATISTICS_KEYS = ("schema", "verdict", "direction", "verdict_words", "reasons", "diagnostics", "interval",
                   "replication", "calibration", "sequential", "positions", "statistics_rules", "gpu_busy")
# the rules the statistics keys were computed by; an audit recorded under others (or before the key) is compared
# with a recomputation on the rest only. issue-52: steadier steps never narrow, position effect subtracted,
# calibrations pooled within their maximum age on the same CPU, kernel and GPUs. Since issue 50 a calibration may
# record the baseline's step profile, and the candidate's steps are then taken about a line in it (noise.py; the
# audit's interval.noise says profile_fitted): a calibration recorded before has none, so its audits recompute as
# recorded. issue-50: the triplets a +-5% interval needs (interval, gpu_busy.expected, calibration.json) count the
# error of the A/A mean subtracted from every triplet, which no K lowers: an audit recorded under issue-52 whose
# calibration carried a position effect named too few (gpu_busy's busy shares are then shown as recorded too)
STATISTICS_RULES = "issue-50"
VOLATILE_KEYS = ("audited_at", "ledger_head")  # may differ between two audits of the same evidence
# sections an audit.json recorded before them lacks: it stays as recorded
ADDED_LATER = ("probe_cost", "host_watch", "recipe", "compile_cache", "commands", "positions", "statistics_rules",
               "gpu_busy", "isolation")
# the units of audit.json's figures (also in `orch schema --kind audit`); its keys stay as recorded
AUDIT_UNITS = {
    "speedup.windows[].A|C|B": "s: the window's time, the SUM of its steps' times",
    "speedup.windows[].step_times, speedup.step_times": "s per step (max over ranks, probe work excluded)",
    "speedup.windows[].ratio|drift|cv|noise, speedup.headline": "unitless",
    "memory.ranks[].*, memory.max_delta_*": "bytes",
    "cost.gpu_seconds, cost.total_gpu_seconds": "GPU-seconds",
    "cost.lock_held_gpu_seconds, cost.between_packages_gpu_seconds": "GPU-seconds",
    "cost.wall_s, cost.total_wall_s, cost.lock_wait_s, cost.lock_held_s, cost.between_packages_s": "s",
    "probe_cost.rows[].*.fractions|median|max|digest_median|rest_median": "unitless: probe s / step s",
    "probe_cost.rows[].*.probe_s_median": "s",
}


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
    lock = ev.run.lock
    doc: dict[str, Any] = {
        "gpu_seconds": by_package,
        "total_gpu_seconds": sum(by_package.values()),
        "wall_s": wall,
        "total_wall_s": sum(wall.values()),
        "lock_wait_s": None if lock is None else lock.wait_s,
    }
    if lock is not None and lock.held_s is not None:  # absent from runs recorded before the hold was (unchanged)
        # the lock held from the grant to the plan's end, the part no package ran in (orch's seals, checks and
        # cleanup between packages), and both in GPU-seconds at the GPUs each package was charged for (0 on CPU)
        gpus = max((int(ev.closes[name].gpus or 0) for name in ev.names), default=0)
        between = max(0.0, lock.held_s - doc["total_wall_s"])
        doc.update(lock_held_s=lock.held_s, between_packages_s=between, lock_held_gpu_seconds=lock.held_s * gpus,
                   between_packages_gpu_seconds=between * gpus)
    return doc


def _commands(ev: RunEvidence) -> dict[str, list[str]]:
    """Each arm's trainer command as run.json recorded it (runs recorded before it was recorded have none)."""
    return {name: list(arm.command) for name, arm in sorted(ev.run.arms.items()) if arm.command}


def _attribution_doc(ev: RunEvidence) -> dict[str, Any]:
    """What differs between the arms; 'training-code-only' only when nothing but code and switches differ."""
    arms = ev.run.arms
    b, c = arms["baseline"], arms["candidate"]
    b_sw, c_sw = b.switches, c.switches
    b_cf, c_cf = b.config, c.config
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
    sources_differ = b.sources_root != c.sources_root
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
        "commitment_roots": {arm: arms[arm].commitment_root for arm in ARMS},
        "sources_roots": {arm: arms[arm].sources_root for arm in ARMS},
        "sealed_roots": {arm: arms[arm].sealed_root for arm in ARMS},
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
    """The audit document (orch.audit/2) of one verified, complete run; calibration: the block of
    ledger.verdict.decide.calibration (its spread is pooled when usable)."""
    m = ev.protocol.measurement
    rule = run_rule(m, ev.run.sequential)  # repeats: auto, or the rule `orch launch --until-decided` recorded
    labels = launch_labels(ev.repeats, ev.sequential)
    trips = triplets(ev.repeats, ev.sequential)
    times = {label: step_times(ev.steps[label], m.steps) for label in labels}
    sps = triplet_speedups(times, trips, steps=m.steps, warmup=m.warmup, window=m.window, drift_bound=m.drift_bound)
    first = trips[0].labels
    sp = sps[0]  # the owner's triplet: with repeats K it is the first of K, launched A -> C -> B
    ex = exactness(
        ev.steps,
        ev.trains,
        ev.reloads,
        dict(ev.protocol.recipe),
        n_steps=m.steps,
        digest_first=m.digest_first,
        digest_last=m.digest_last,
        model=ev.protocol.model.model_dump() if ev.protocol.model is not None else None,
        watch=ev.watch,
        watch_steps=ev.watch_steps,
        labels=labels,
        replay_of=replay_label(ev.repeats, ev.sequential),
        recipe_file=ev.recipe.recipe if ev.recipe is not None else None,
    )
    cal_spread, cal_window = calibration_spreads(calibration)
    d = log_speedups(sps)
    profile = calibration_step_profile(calibration)
    noise = NoiseEvidence(tuple(triplet_arm_spread(s, profile) for s in sps), calibration_step_spread(calibration))
    iv = verdict_interval(d, cal_spread, rule, noise)
    flagged = outlier_effects(d, outlier_triplets(d, cal_spread), cal_spread, rule)
    ratios = window_ratios(sps)
    win_out = outlier_windows(ratios, cal_window)
    win_eff = window_effects(ratios, win_out, iv, cal_spread, cal_window)
    us = [baseline_disagreement(s) for s in sps]
    ab_eff = baseline_effects(us, baseline_outliers(us, cal_spread), d, cal_spread, rule, noise)
    watch = host_watch_doc(ev, labels)
    gpu_busy = gpu_busy_doc(ev, labels, cal_spread)  # None for a CPU protocol or a run recorded before it
    busy = busy_windows(watch) if watch else []
    cost = _cost_doc(ev)
    seq = None if rule is None else sequential_doc(
        rule, ev.run.sequential.asked if ev.run.sequential is not None else "protocol", d, cal_spread,
        cost["gpu_seconds"], ev.run.sequential, cost["wall_s"], noise, us)
    stopping = None if seq is None or seq["integrity"]["ok"] else seq["integrity"]["words"]
    short_prime = None if m.prime_steps is None else (m.prime_steps, m.steps)
    caches = compile_cache_doc(ev.run, cost["gpu_seconds"], ex.exact, m.compile, short_prime)
    verdict, direction, sentence = decide(ex.exact, iv, busy, flagged, [str(t.index) for t in trips], stopping,
                                          win_eff, [w.name for w in sp.windows], ab_eff,
                                          unprimed=(caches or {}).get("unprimed") or ())
    reasons = list(ex.problems) if not ex.exact else ([] if verdict == "accepted" else [sentence])
    if ex.exact and not iv.bounded and calibration and calibration.get("stale"):
        reasons.append(str(calibration["words"]))  # why no calibration bounds it (expired, another CPU or GPUs)
    if caches is not None and not ex.exact:
        reasons += [f"compile cache: {line}" for line in caches["diagnosis"]]
    diagnostics = (drift_notes(trips, sps, m.drift_bound)
                   + outlier_notes(trips, [e.outlier for e in flagged], win_out, [w.name for w in sp.windows]))
    interval = interval_doc(
        iv, headlines=[s.headline for s in sps], calibration_run=(calibration or {}).get("run_id"),
        window_spread=window_spread(ratios), outlier_triplets=flagged, outlier_windows=win_out,
        triplet_index=[t.index for t in trips], rule=rule, calibration=cal_spread, sequential=seq,
        window_effects=win_eff, calibration_window=cal_window,
        baseline_check=None if noise.calibration_step is None or cal_spread is None else (us, ab_eff))
    return {
        "schema": AUDIT_SCHEMA,
        "run_id": ev.run_id,
        "protocol_id": ev.run.protocol_id,
        "protocol_name": ev.protocol.name,
        "audited_at": audited_at,
        "verdict": verdict,
        "direction": direction,
        "verdict_words": sentence,
        "exact": ex.exact,
        "noisy": sp.noisy,
        "reasons": reasons,
        "diagnostics": diagnostics,
        "scope": scope_sentence(m.digest_first, m.digest_last, ex.ranks),
        "measurement": m.model_dump(exclude_unset=True),  # as recorded: fields added later stay out
        "precision": ev.protocol.precision,
        "recipe": recipe_doc(ev.recipe),
        "speedup": _speedup_doc(sp, {role: times[label] for role, label in first.items()}),
        "interval": interval,
        "sequential": seq,
        "replication": replication_doc(trips, sps),
        "positions": positions_doc(trips, sps, cal_spread),
        "statistics_rules": STATISTICS_RULES,
        "exactness": _exactness_doc(ex),
        "memory": _memory_doc(ev, first),
        **({} if caches is None else {"compile_cache": caches}),
        "cost": cost,
        "attribution": _attribution_doc(ev),
        # the trainer command orch rendered for each arm (recipe flags first for a short-form protocol)
        **({} if not _commands(ev) else {"commands": _commands(ev)}),
        "integrity": {
            "seals_verified": list(ARMS),
            "result_sha256": {name: ev.closes[name].result_digest for name in ev.names},
            "ledger_records": sum(1 for r in ev.records if r.kind in KINDS),
        },
        "versions": dict(ev.checks.versions),
        "host_hash": ev.run.host.host_hash,
        "calibration": calibration,
        **({} if (iso := isolation_doc(ev.run)) is None else {"isolation": iso}),
        "quiet_host": quiet_host_doc(ev.trains, labels),
        "host_watch": watch,
        **({} if gpu_busy is None else {"gpu_busy": gpu_busy}),
        "clock": clock_doc(ev.trains, labels),
        "probe_cost": probe_cost_doc({label: ev.steps[label] for label in labels}, m.steps, m.warmup),
        "calibration_of": None if ev.run.calibration_of is None else ev.run.calibration_of.model_dump(),
        "ledger_head": {"size": head[0], "root": head[1]},
    }


def canonical_bytes(doc: Mapping[str, Any]) -> bytes:
    return canonical_json(doc, ensure_ascii=False, pretty=True).encode()


def evidence_part(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in VOLATILE_KEYS}
