"""orchestrator/run/housekeeping.py: only dead runs lose their scratch; a live run's (its owner lock held) never
does."""

from __future__ import annotations

import json
from pathlib import Path

from ledger.cost.store import Ledger
from orchestrator.run.housekeeping import STAGING_PREFIX, is_dead, remove_stale_scratch, report_orphans
from protocol.home import OWNERS_DIR, resolve_home


def _run_json(home_runs: Path, run_id: str, status: str) -> None:
    (home_runs / run_id).mkdir(parents=True)
    (home_runs / run_id / "run.json").write_text(json.dumps({"run_id": run_id, "status": status}))


def test_dead_is_a_free_owner_lock_or_without_one_an_ended_record(tmp_path: Path) -> None:
    home = resolve_home(tmp_path)
    with home.hold_owner("live"):
        assert home.run_is_live("live") is True and not is_dead(home, "live")
    assert home.run_is_live("live") is None  # its lock file goes at the run's end
    home.owner_lock("crashed").parent.mkdir(parents=True, exist_ok=True)
    home.owner_lock("crashed").touch()  # left by a killed orch: present, not held
    assert is_dead(home, "crashed")
    _run_json(home.runs, "old-ended", "complete")
    _run_json(home.runs, "old-running", "running")
    assert is_dead(home, "old-ended") and not is_dead(home, "old-running")
    assert is_dead(home, "never-seen")  # no lock and no folder: nothing of it is alive


def test_stale_scratch_and_half_written_runs_of_dead_runs_go_a_live_runs_stay(tmp_path: Path) -> None:
    home = resolve_home(tmp_path)
    for run_id in ("crashed", "live", "old-running"):
        (home.scratch / run_id / "ckpt").mkdir(parents=True)
    (home.scratch / "not a run id!").mkdir()
    (home.runs / f"{STAGING_PREFIX}crashed").mkdir(parents=True)
    home.owner_lock("crashed").parent.mkdir(parents=True, exist_ok=True)
    home.owner_lock("crashed").touch()
    _run_json(home.runs, "old-running", "running")
    said: list[str] = []
    with home.hold_owner("live"):
        removed = remove_stale_scratch(home, said.append)
    assert removed == ["crashed", "crashed"]  # its scratch, then its half-written run folder
    assert sorted(p.name for p in home.scratch.iterdir()) == [OWNERS_DIR, "live", "not a run id!", "old-running"]
    assert not (home.runs / f"{STAGING_PREFIX}crashed").exists() and not home.owner_lock("crashed").exists()
    assert said == ["removed scratch/crashed of dead run crashed (its orch process is gone)",
                    f"removed runs/{STAGING_PREFIX}crashed of dead run crashed (its orch process is gone)"]


def test_an_open_record_is_an_orphan_unless_its_run_is_live(tmp_path: Path) -> None:
    home = resolve_home(tmp_path)
    ledger = Ledger(home.ledger_path)
    common = {"kind": "train", "arm": "baseline", "gpus": 0, "host": "ab" * 32, "protocol_id": "cd" * 32}
    for run_id in ("gone", "live"):
        ledger.append(run_id=run_id, package="train-A", status="open", **common)
    said: list[str] = []
    with home.hold_owner("live"):
        found = report_orphans(home, ledger, said.append)
    assert found == [("gone", "train-A")]
    assert said == ["orphaned: run gone package train-A has an open ledger record and no close (a crash or kill -9)"]
