"""`orch calibrate PROTOCOL [--repeats K]`: an A/A run (the candidate arm replaced by the baseline) that measures
this host's noise floor for the workload, recorded in the ledger against the host fingerprint and protocol id.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ledger.cost.store import Ledger
from ledger.verdict.calibration import CALIBRATION_FILE, Calibration, fingerprint
from orchestrator.launch import LaunchResult, launch
from protocol.errors import FailedError
from protocol.fileio import write_atomic
from protocol.home import resolve_home
from protocol.run_record import CalibrationOf, RunRecord
from protocol.schema import LoadedProtocol, Protocol, load_protocol, protocol_id


def aa_protocol(loaded: LoadedProtocol, repeats: int | None) -> LoadedProtocol:
    """The same protocol with the baseline in both arms (sources, switches, configuration) and K triplets."""
    p = loaded.protocol
    data = p.model_dump(mode="json", by_alias=True)
    base = data["arms"]["baseline"]
    data["arms"] = {"baseline": base, "candidate": dict(base)}
    data["name"] = f"{p.name}-aa"
    m = p.measurement
    data["measurement"]["repeats"] = repeats if repeats is not None else (m.fixed_repeats or m.max_repeats)
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
    host = audit_host(result)
    cal = Calibration(
        run_id=result.run_id, of_protocol_id=loaded.id, of_protocol_name=loaded.protocol.name,
        aa_protocol_id=protocol_id(aa.protocol), host=fingerprint(host),
        repeats=aa.protocol.measurement.fixed_repeats or 1,
        headlines=list(audit["replication"]["headlines"]), estimate=iv["estimate"], low=iv["low"], high=iv["high"],
        level=iv["level"], launch_sd=iv["variance"]["launch_sd"], launch_level_sd=iv["variance"]["launch_level_sd"],
        window_level_sd=iv["variance"]["window_level_sd"], triplets_for_5pct=iv["triplets_for_5pct"],
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
        note=f"A/A calibration: null speedup {cal.estimate:.4f}x in [{low}, {high}]",
    )
    say(f"calibration recorded for protocol {loaded.id[:12]} on this host: null speedup {cal.estimate:.4f}x in "
        f"[{low}, {high}] ({cal.level:.0%}), headlines " + " / ".join(f"{h:.4f}" for h in cal.headlines))
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
