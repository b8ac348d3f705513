"""`orch calibrate PROTOCOL [--repeats K]`: an A/A run (the candidate arm replaced by the baseline, K triplets, 5 by
default) that measures this host's spread between triplets for the workload, recorded in the ledger against the host
fingerprint and protocol id; later audits of the protocol pool it (ledger/verdict/stats.py paired_interval).
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
from ledger.verdict.calibration import CALIBRATION_FILE, Calibration, fingerprint
from ledger.verdict.stats import Spread, triplets_needed
from orchestrator.launch import LaunchResult, launch
from protocol.errors import FailedError, UsageError
from protocol.fileio import write_atomic
from protocol.home import resolve_home
from protocol.run_record import CalibrationOf, RunRecord
from protocol.schema import LoadedProtocol, Protocol, baseline_workload_id, load_protocol, protocol_id

DEFAULT_REPEATS = 5  # A/A triplets: df 4 for the spread between triplets (t multiplier 2.78 at K = 1 pooled)


def aa_protocol(loaded: LoadedProtocol, repeats: int | None) -> LoadedProtocol:
    """The same protocol with the baseline in both arms (sources, switches, configuration) and K triplets (a fixed
    design: DEFAULT_REPEATS unless given)."""
    k = DEFAULT_REPEATS if repeats is None else repeats
    if k < 2:
        raise UsageError(f"--repeats {k}: an A/A calibration needs at least 2 triplets to measure the spread between "
                         f"triplets; give --repeats 2 or more (default {DEFAULT_REPEATS})")
    p = loaded.protocol
    data = p.model_dump(mode="json", by_alias=True)
    base = data["arms"]["baseline"]
    data["arms"] = {"baseline": base, "candidate": dict(base)}
    data["name"] = f"{p.name}-aa"
    data["measurement"]["repeats"] = k
    for key in ("max_repeats", "target_half_width"):  # repeats: auto's rule: the A/A run is a fixed design
        data["measurement"].pop(key, None)
    for key in ("max_repeats", "target_half_width"):  # repeats: auto's rule: the A/A run is a fixed design
        data["measurement"].pop(key, None)
    aa = Protocol.model_validate(data)
    return LoadedProtocol(protocol=aa, path=loaded.path, base=loaded.base)


def calibrate(
    protocol_path: Path, repeats: int | None = None, home_dir: Path | None = None, say: Callable[[str], None] = print,
    lock_timeout: float | None = None, lock_dir: Path | None = None,
) -> tuple[LaunchResult, Calibration]:
    """Launch the A/A run, then record what it measured; a not-exact A/A run is not a calibration (exit 1)."""
    loaded = load_protocol(protocol_path)
    aa = aa_protocol(loaded, repeats)
    say(f"calibration of {loaded.protocol.name} ({loaded.id[:12]}): A/A run of the baseline, "
        f"{aa.protocol.measurement.repeats} triplet(s)")
    result = launch(protocol_path, home_dir, say=say, lock_timeout=lock_timeout, lock_dir=lock_dir, loaded=aa,
                    calibration_of=CalibrationOf(protocol_id=loaded.id, protocol_name=loaded.protocol.name))
    audit: dict[str, Any] = result.audit or {}
    if audit.get("verdict") == "not exact":
        reason = (audit.get("reasons") or ["not exact"])[0]
        raise FailedError(f"calibration run {result.run_id} is not exact ({reason}): the baseline does not repeat "
                          "its own bits on this host; nothing was recorded as a calibration")
    iv = audit["interval"]
    rep = audit["replication"]
    d = [float(x) for x in iv["log_speedups"]]
    spread = Spread.of(d)
    if spread is None or "variance_source" not in iv:  # aa_protocol gives K >= 2; a paired audit is written above
        raise FailedError(f"calibration run {result.run_id}: its audit has no paired spread; nothing was recorded")
    window = iv.get("window_spread") or {}
    host = audit_host(result)
    cal = Calibration(
        run_id=result.run_id, of_protocol_id=loaded.id, of_protocol_name=loaded.protocol.name,
        aa_protocol_id=protocol_id(aa.protocol), workload_id=baseline_workload_id(loaded.protocol),
        host=fingerprint(host), repeats=len(d),
        headlines=list(rep["headlines"]), log_speedups=d, sd=spread.sd, df=spread.df,
        window_sd=window.get("sd"), window_df=int(window.get("df") or 0), mean_log_speedup=math.fsum(d) / len(d),
        estimate=iv["estimate"], low=iv["low"], high=iv["high"], level=iv["level"],
        triplets_for_5pct=triplets_needed(spread.sd, spread.df), recorded_at=time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                                           time.gmtime()),
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
        note=f"A/A calibration: {cal.repeats} triplets, SD {cal.sd:.4f} (df {cal.df}), null speedup "
             f"{cal.estimate:.4f}x in [{low}, {high}]",
    )
    need = ("out of reach" if cal.triplets_for_5pct is None else
            f"about {cal.triplets_for_5pct} triplet(s) of a later run")
    say(f"calibration recorded for protocol {loaded.id[:12]} on this host: {cal.repeats} A/A triplets, SD "
        f"{cal.sd:.4f} of the paired log speedup (df {cal.df}); null speedup {cal.estimate:.4f}x in [{low}, {high}] "
        f"({cal.level:.0%}), headlines " + " / ".join(f"{h:.4f}" for h in cal.headlines)
        + f"; a +-5% interval: {need}; later audits of this protocol on this host pool it")
    if not cal.covers_one:
        say("warning: the A/A interval excludes 1: identical arms read as different on this host (a position or "
            "warm-up effect); read later verdicts of this workload with that in mind")
    return result, cal


def audit_host(result: LaunchResult) -> dict[str, Any]:
    try:
        record = RunRecord.model_validate_json((result.run_dir / "run.json").read_bytes())
    except (OSError, ValidationError) as err:
        raise FailedError(f"run {result.run_id}: run.json has no host fingerprint; nothing was recorded") from err
    return record.host.model_dump()
