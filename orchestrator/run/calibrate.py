"""`orch calibrate PROTOCOL [--repeats K]`: K separate A/A launches (the candidate arm replaced by the baseline, one
triplet each, 5 by default) that measure this host's spread between fresh launches for the workload, recorded in the
ledger against the host fingerprint, protocol id and baseline workload; later audits pool it
(ledger/verdict/decide/stats.py paired_interval).

Why launches, not triplets of one launch: the owner's run is one launch of one triplet, so its d varies as much as
separate launches do. Triplets inside one launch share its conditions (the host's load in those minutes, its checks
and sealed copies); on the lent H200 host's CPUs the null triplets' d differed between launches more than within one
(docs/validation/VERDICT.md: one-way ANOVA F = 3.57, p = 0.016), so a spread measured inside one launch understates
what a later launch sees.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ledger.cost.store import Ledger
from ledger.verdict.decide.calibration import CALIBRATION_FILE, Calibration, fingerprint
from ledger.verdict.decide.noise import aa_step_profile, aa_step_spread
from ledger.verdict.decide.stats import Spread, paired_interval, pooled, triplets_needed, width_floor
from orchestrator.run.launch import LaunchResult, launch
from protocol.errors import FailedError, UsageError
from protocol.fileio import write_atomic
from protocol.home import resolve_home
from protocol.run_record import CalibrationOf, RunRecord
from protocol.schema import LoadedProtocol, Protocol, baseline_workload_id, load_protocol, protocol_id

DEFAULT_REPEATS = 5  # A/A launches: df 4 for the spread between launches (t multiplier 2.78 at K = 1 pooled)


def launches_asked(repeats: int | None, flag: str = "--repeats") -> int:
    k = DEFAULT_REPEATS if repeats is None else repeats
    if k < 2:
        raise UsageError(f"{flag} {k}: an A/A calibration needs at least 2 launches to measure the spread between "
                         f"launches; give {flag} 2 or more (default {DEFAULT_REPEATS})")
    return k


def aa_protocol(loaded: LoadedProtocol) -> LoadedProtocol:
    """The same protocol with the baseline in both arms (sources, switches, configuration) and one triplet: one
    A/A launch of the calibration (a fixed design)."""
    p = loaded.protocol
    data = p.model_dump(mode="json", by_alias=True)
    base = data["arms"]["baseline"]
    data["arms"] = {"baseline": base, "candidate": dict(base)}
    data["name"] = f"{p.name}-aa"
    data["measurement"]["repeats"] = 1
    for key in ("max_repeats", "target_half_width"):  # repeats: auto's rule: the A/A run is a fixed design
        data["measurement"].pop(key, None)
    aa = Protocol.model_validate(data)
    return LoadedProtocol(protocol=aa, path=loaded.path, base=loaded.base)


def calibrate(
    protocol_path: Path, repeats: int | None = None, home_dir: Path | None = None, say: Callable[[str], None] = print,
    lock_timeout: float | None = None, lock_dir: Path | None = None,
) -> tuple[LaunchResult, Calibration]:
    """K A/A launches, then record what they measured (in the last launch's run folder); a not-exact A/A launch is
    not a calibration (exit 1) and stops it."""
    loaded = load_protocol(protocol_path)
    k = launches_asked(repeats)
    aa = aa_protocol(loaded)
    say(f"calibration of {loaded.protocol.name} ({loaded.id[:12]}): {k} A/A launches of the baseline, one triplet "
        "each")
    results: list[LaunchResult] = []
    d: list[float] = []
    headlines: list[float] = []
    windows: list[Spread] = []
    steps: list[Spread] = []  # the baseline's within-launch step spread, each launch's (issue 34)
    us: list[float] = []  # each launch's A/B log ratio u (issue 52)
    levels: list[list[float]] = []  # each launch's launch-position levels (issue 52)
    profiles: list[tuple[tuple[int, ...], list[float]]] = []  # each launch's baseline step profile
    for i in range(1, k + 1):
        say(f"A/A launch {i} of {k}")
        # the first launch runs the GPU diagnostics; a later one again only if this host's versions changed
        of = CalibrationOf(protocol_id=loaded.id, protocol_name=loaded.protocol.name,
                           diagnosed_by=results[0].run_id if results else None)
        result = launch(protocol_path, home_dir, say=say, lock_timeout=lock_timeout, lock_dir=lock_dir, loaded=aa,
                        calibration_of=of)
        audit: dict[str, Any] = result.audit or {}
        if audit.get("verdict") == "not exact":
            reason = (audit.get("reasons") or ["not exact"])[0]
            raise FailedError(f"calibration run {result.run_id} is not exact ({reason}): the baseline does not "
                              "repeat its own bits on this host; nothing was recorded as a calibration")
        iv = audit.get("interval") or {}
        if "variance_source" not in iv or len(iv.get("log_speedups", [])) != 1:
            raise FailedError(f"calibration run {result.run_id}: its audit has no paired log speedup of one triplet; "
                              "nothing was recorded")
        results.append(result)
        d.append(float(iv["log_speedups"][0]))
        headlines.append(float(audit["replication"]["headlines"][0]))
        w = iv.get("window_spread") or {}
        if w.get("sd") is not None and w.get("df"):
            windows.append(Spread(float(w["sd"]), int(w["df"])))
        step = aa_step_spread(audit.get("speedup") or {})
        if step is not None:
            steps.append(step)
        profile = aa_step_profile(audit.get("speedup") or {})
        if profile is not None:
            profiles.append(profile)
        u, level = launch_positions(audit.get("speedup") or {})
        us.append(u)
        levels.append(level)
    result = results[-1]
    spread = Spread.of(d)
    if spread is None:  # k >= 2 launches, each one d
        raise FailedError(f"calibration run {result.run_id}: fewer than two A/A launches; nothing was recorded")
    window = pooled(*windows) if windows else None
    step = pooled(*steps) if steps else None
    own = paired_interval(d)
    profile_steps, step_profile = mean_profile(profiles, len(results))
    launch_hosts = [audit_host(r) for r in results]
    host = launch_hosts[-1]
    hosts = {h["host_hash"] for h in launch_hosts}
    if len(hosts) != 1:
        raise FailedError(f"calibration runs {results[0].run_id}..{result.run_id} ran on {len(hosts)} host "
                          "fingerprints; nothing was recorded")
    cal = Calibration(
        run_id=result.run_id, run_ids=[r.run_id for r in results], of_protocol_id=loaded.id,
        of_protocol_name=loaded.protocol.name, aa_protocol_id=protocol_id(aa.protocol),
        workload_id=baseline_workload_id(loaded.protocol), host=fingerprint(host), repeats=len(d),
        headlines=headlines, log_speedups=d, sd=spread.sd, df=spread.df,
        window_sd=None if window is None else window.sd, window_df=0 if window is None else int(window.df),
        step_sd=None if step is None else step.sd, step_df=0 if step is None else int(step.df),
        profile_steps=profile_steps, step_profile=step_profile,
        mean_log_speedup=math.fsum(d) / len(d), ab_log_ratios=us, position_levels=levels,
        estimate=own.estimate, low=own.low if own.bounded else None,
        high=None if math.isinf(own.high) else own.high, level=own.level,
        # a later run subtracts this calibration's A/A mean over its launches, whose error no K removes
        triplets_for_5pct=triplets_needed(spread.sd, spread.df, carried=spread.sd**2 / len(d)),
        recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    data = (cal.model_dump_json(by_alias=True, indent=1) + "\n").encode()
    write_atomic(result.run_dir / CALIBRATION_FILE, data)
    home = resolve_home(home_dir)
    low = "0" if cal.low is None else f"{cal.low:.4f}"
    high = "inf" if cal.high is None else f"{cal.high:.4f}"
    Ledger(home.ledger_path).append(
        run_id=result.run_id, package="calibration", kind="calibration", arm=None, status="ok",
        started=cal.recorded_at, ended=cal.recorded_at, wall_s=0.0, gpus=0, gpu_seconds=0.0, lock_wait_s=0.0,
        host=host["host_hash"], protocol_id=loaded.id, result_digest=hashlib.sha256(data).hexdigest(), exit_code=0,
        note=f"A/A calibration: {cal.repeats} launches of one triplet ({', '.join(cal.run_ids or [])}), SD "
             f"{cal.sd:.4f} (df {cal.df}), null speedup {cal.estimate:.4f}x in [{low}, {high}]",
    )
    need = ("out of reach at any K: the A/A mean a later run subtracts is itself known only to +-"
            f"{width_floor(cal.sd**2 / cal.repeats, cal.level):.1%}, and more A/A launches narrow it"
            if cal.triplets_for_5pct is None else
            f"about {cal.triplets_for_5pct} triplet(s) of a later run")
    say(f"calibration recorded for protocol {loaded.id[:12]} on this host: {cal.repeats} A/A launches, SD "
        f"{cal.sd:.4f} of the paired log speedup between launches (df {cal.df}); null speedup {cal.estimate:.4f}x "
        f"in [{low}, {high}] ({cal.level:.0%}), headlines " + " / ".join(f"{h:.4f}" for h in cal.headlines)
        + f"; a +-5% interval: {need}; later audits of this workload on this host pool it with every other "
        "calibration of it recorded within measurement.calibration_max_age_days (default 7) on the same CPU, kernel "
        "and GPUs, and subtract the A/A mean (the launch positions' effect)")
    if not cal.covers_one:
        say("warning: the A/A interval excludes 1: identical arms read as different on this host (a position or "
            "warm-up effect); later verdicts subtract it, its variance carried, so their intervals widen")
    return result, cal


def mean_profile(profiles: list[tuple[tuple[int, ...], list[float]]],
                 launches: int) -> tuple[list[int] | None, list[float] | None]:
    """The A/A launches' step profiles averaged step by step; (None, None) unless every launch gave one for the same
    steps."""
    if len(profiles) != launches or len({steps for steps, _ in profiles}) != 1:
        return None, None
    return list(profiles[0][0]), [math.fsum(col) / len(col) for col in zip(*(p for _, p in profiles), strict=True)]


def launch_positions(speedup_doc: dict[str, Any]) -> tuple[float, list[float]]:
    """(u, levels) of one A/A launch (one triplet, order A C B) from its audit's "speedup" block: u = mean over the
    owner's windows of log(A_w / B_w), and the mean log window time at positions 0, 1, 2 less their mean."""
    windows = speedup_doc.get("windows") or []
    if not windows:
        raise FailedError("an A/A launch's audit has no windows; nothing was recorded as a calibration")
    mean_log = {role: math.fsum(math.log(float(w[role])) for w in windows) / len(windows) for role in ("A", "C", "B")}
    centre = math.fsum(mean_log.values()) / 3.0
    return mean_log["A"] - mean_log["B"], [mean_log[r] - centre for r in ("A", "C", "B")]


def audit_host(result: LaunchResult) -> dict[str, Any]:
    try:
        record = RunRecord.model_validate_json((result.run_dir / "run.json").read_bytes())
    except (OSError, ValidationError) as err:
        raise FailedError(f"run {result.run_id}: run.json has no host fingerprint; nothing was recorded") from err
    return record.host.model_dump()
