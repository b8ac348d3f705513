"""What a launch tidies once it holds the lock: reports runs that died with open records, removes their scratch.

A run is dead when its owner lock (held by its orch process for its whole life) is free: never a live run's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from ledger.cost.store import Ledger
from orchestrator.isolation.sealing import unseal_for_removal
from protocol.errors import UsageError
from protocol.home import OWNERS_DIR, Home, validate_run_id
from protocol.run_record import EarlierRun

STAGING_PREFIX = ".new-"  # runs/.new-<run id>: a run folder being written, renamed into place when complete


def _run_ended(home: Home, run_id: str) -> bool:
    """A run without an owner lock (an older orch's) counts as ended only when its run record says so."""
    path = home.runs / run_id / "run.json"
    if not path.exists():
        return not (home.runs / run_id).exists()
    run = EarlierRun.read(path)
    return run is not None and run.status in ("complete", "failed", "interrupted")


def is_dead(home: Home, run_id: str) -> bool:
    live = home.run_is_live(run_id)
    return live is False or (live is None and _run_ended(home, run_id))


def report_orphans(home: Home, ledger: Ledger, say: Callable[[str], None]) -> list[tuple[str, str]]:
    """Open records of runs whose orch is gone (a crash or kill -9); a live run's open record is not named."""
    found = []
    for run_id, package in ledger.orphans():
        try:
            if home.run_is_live(run_id):
                continue
        except UsageError:
            pass  # not a run id orch makes: report it as it is
        found.append((run_id, package))
        say(f"orphaned: run {run_id} package {package} has an open ledger record and no close (a crash or kill -9)")
    return found


def _remove(path: Path) -> None:
    if path.exists():
        unseal_for_removal(path)
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_scratch(home: Home, say: Callable[[str], None]) -> list[str]:
    """Remove scratch folders (and half-written run folders) of dead runs; returns their run ids."""
    removed = []
    staging = sorted(home.runs.glob(STAGING_PREFIX + "*")) if home.runs.is_dir() else []
    entries = sorted(home.scratch.iterdir()) if home.scratch.is_dir() else []
    for entry in [*entries, *staging]:
        name = entry.name.removeprefix(STAGING_PREFIX) if entry.parent == home.runs else entry.name
        if entry.name == OWNERS_DIR or not entry.is_dir():
            continue
        try:
            validate_run_id(name)
        except UsageError:
            continue
        if not is_dead(home, name):
            continue
        _remove(entry)
        removed.append(name)
        say(f"removed {entry.parent.name}/{entry.name} of dead run {name} (its orch process is gone)")
    owners = home.scratch / OWNERS_DIR
    for lock in sorted(owners.glob("*.lock")) if owners.is_dir() else []:
        run_id = lock.name.removesuffix(".lock")
        try:
            dead = home.run_is_live(run_id) is False and not (home.scratch / run_id).exists()
        except UsageError:
            continue
        if dead:
            lock.unlink(missing_ok=True)
    return removed
