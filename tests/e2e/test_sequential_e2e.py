"""The sequential stop end to end: one real `orch launch` of the minimal trainer (1 CPU rank: nothing here is about
r3-mini or ranks; launchutil.make_minimal_project) with measurement.repeats: auto, at most 2 triplets, no
calibration: triplets are added one at a time, the first look comes at the second (no calibration allows one at the
first) and the rule stops there, every package in the ledger. Runs of more looks, a look that goes on, and each way
the rule stops are tests/unit/test_sequential_launch.py's (fabricated packages)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from launchutil import MINIMAL_PROTOCOL, edit_protocol, env, launch_cmd, make_minimal_project, one_rank, records

from ledger.verdict.decide.sequential_doc import rule_of, sequential_doc
from ledger.verdict.decide.stats import triplet_log_speedup
from protocol.plan import package_names
from protocol.schema import load_protocol
from protocol.sequential_run import SequentialRecord

MAX = 2  # a third triplet would add 6 packages, about 25 s of this suite's time


def _auto(data: dict[str, Any]) -> None:
    one_rank(data)  # the rule's bookkeeping, not the ranks
    data.setdefault("measurement", {}).update(repeats="auto", max_repeats=MAX)


def test_repeats_auto_adds_triplets_until_the_rule_stops(tmp_path: Path) -> None:
    proj = make_minimal_project(tmp_path)
    protocol = edit_protocol(proj, _auto, name="auto.yaml", source=MINIMAL_PROTOCOL)
    home = tmp_path / "home"
    began = time.monotonic()
    proc = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=1800)
    wall = time.monotonic() - began
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["status"] == "complete" and out["verdict"] in ("accepted", "no difference shown"), proc.stderr[-3000:]
    run_dir = home / "runs" / out["run_id"]
    run = json.loads((run_dir / "run.json").read_text())
    seq = SequentialRecord.model_validate(run["sequential"])
    k = seq.triplets
    assert k is not None and 2 <= k <= MAX and seq.asked == "protocol" and seq.stop in ("decided", "precise", "maximum")
    assert [p["name"] for p in run["packages"]] == list(package_names(k, sequential=True, prime=False))
    closes = {r["package"]: r for r in records(home) if r["run_id"] == out["run_id"] and r["status"] != "open"}
    assert set(closes) >= set(package_names(k, sequential=True, prime=False))
    assert all(closes[n]["status"] == "ok" for n in package_names(k, sequential=True, prime=False))
    # every look was said, and the audit's triplets replay to the same stop
    looks = [line for line in proc.stderr.splitlines() if "look " in line and "repeated interval" in line]
    assert len(looks) == len(seq.looks) == k - 1
    audit = json.loads((run_dir / "audit.json").read_text())
    d = [triplet_log_speedup(t["ratios"]) for t in audit["replication"]["triplets"]]
    assert len(d) == k
    rule = rule_of(load_protocol(protocol).protocol.measurement)
    assert rule is not None
    wall_s = {n: float(closes[n]["wall_s"]) for n in closes}
    doc = sequential_doc(rule, seq.asked, d, None, {n: float(closes[n]["gpu_seconds"]) for n in closes}, seq,
                         wall_s=wall_s)
    assert doc["integrity"]["ok"], doc["integrity"]["words"]
    assert doc["stop"] == seq.stop and doc["rule_triplets"] == k
    print(f"\nsequential e2e: {k} triplet(s), stop {seq.stop}, looks "
          + "; ".join(f"{lk['triplets']}: [{lk['low']:.3f}, {lk['high']:.3f}]" for lk in doc["looks"])
          + f"; triplets {doc['wall_s']['decision']:.0f} s of {doc['wall_s']['run']:.0f} s packages, "
          f"launch {wall:.0f} s wall")
