"""Ledger benchmark: append latency with fsync (p50/p99), then summary and verify time at 1M records.

Prints a table and writes the figures to .orch/bench/ledger.json. Goals: p99 append <= 10 ms,
summary of 1M <= 1 s, verify of 1M <= 3 s. Times are medians of --repeat runs; the 1-minute load is recorded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ledger.cost.accounting import columns_for, summarize
from ledger.cost.record import GENESIS, record_message, schema_message, seal
from ledger.cost.store import Ledger

PACKAGES = [("checks", "checks", None), ("train-A", "train", "baseline"), ("reload-A", "reload", "baseline"),
            ("train-C", "train", "candidate"), ("reload-C", "reload", "candidate"), ("train-B", "train", "baseline"),
            ("reload-B", "reload", "baseline"), ("score", "score", None)]
HOST = hashlib.sha256(b"bench-host").hexdigest()


def fields(i: int) -> dict[str, Any]:
    """Record i of a synthetic history: runs of 8 packages, each an open then a close record."""
    run, step = i // 16, i % 16
    name, kind, arm = PACKAGES[step // 2]
    day = 1 + run % 28
    base: dict[str, Any] = {
        "run_id": f"2025{day:04d}T120000Z-{run:08x}", "package": name, "kind": kind, "arm": arm,
        "started": f"2025-02-{day:02d}T12:{step:02d}:00Z", "gpus": 8, "host": HOST,
        "protocol_id": hashlib.sha256(str(run % 5).encode()).hexdigest(), "lock_wait_s": 1.25,
        "sources_root": "c" * 64 if arm else None,
    }
    if step % 2 == 0:
        return {**base, "status": "open"}
    failed = run % 50 == 7 and kind == "score"
    return {**base, "status": "failed" if failed else "ok", "ended": f"2025-02-{day:02d}T12:{step:02d}:59Z",
            "wall_s": 59.0 + step / 8, "gpu_seconds": 8 * (59.0 + step / 8), "result_digest": "d" * 64,
            "peak_allocated": 70_000_000_000 + i, "peak_reserved": 75_000_000_000, "exit_code": 1 if failed else 0}


def build(path: Path, n: int) -> float:
    """Write an n-record ledger without fsync, through the same seal/serialize code that append uses."""
    t0 = time.perf_counter()
    prev_hash, prev_msg = GENESIS, hashlib.sha256(schema_message()).hexdigest()
    offsets = []  # the message offset index that append keeps beside the ledger
    pos = len(schema_message())
    with open(path, "wb") as f:
        f.write(schema_message())
        chunk: list[bytes] = []
        for i in range(n):
            rec = seal({**fields(i), "seq": i, "prev_hash": prev_hash, "prev_message_sha256": prev_msg})
            msg = record_message(rec)
            prev_hash, prev_msg = rec.record_hash, hashlib.sha256(msg).hexdigest()
            offsets.append(pos)
            pos += len(msg)
            chunk.append(msg)
            if len(chunk) == 4096:
                f.write(b"".join(chunk))
                chunk.clear()
        f.write(b"".join(chunk))
    Path(str(path) + ".idx").write_bytes(b"".join(o.to_bytes(8, "little") for o in offsets))
    return time.perf_counter() - t0


def timed(repeat: int, fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn's last result, the median of `repeat` wall times, and the 1-minute load average before the runs."""
    load = os.getloadavg()[0]
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return result, statistics.median(times), load


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--appends", type=int, default=100_000, help="records appended one by one with fsync")
    ap.add_argument("--records", type=int, default=1_000_000, help="size of the ledger for summary and verify")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: a temporary one)")
    ap.add_argument("--out", type=Path, default=Path(".orch/bench/ledger.json"))
    ap.add_argument("--repeat", type=int, default=3, help="runs of summary / verify / head; the median is reported")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a ledger file to measure (built there first when missing): skips the ~3 min build")
    args = ap.parse_args()
    figures: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    with tempfile.TemporaryDirectory(prefix="orch-bench-ledger-", dir=args.dir) as tmp:
        ledger = Ledger(Path(tmp) / "append" / "ledger.arrows")
        lat: list[float] = []
        for i in range(args.appends):
            f = fields(i)
            f.pop("host")
            t0 = time.perf_counter()
            ledger.append(**f)
            lat.append(time.perf_counter() - t0)
        figures["append"] = {"records": args.appends, "fsync": True, "p50_ms": pct(lat, 0.5) * 1e3,
                             "p99_ms": pct(lat, 0.99) * 1e3, "max_ms": max(lat) * 1e3}
        big = Ledger(args.reuse or Path(tmp) / "big" / "ledger.arrows")
        build_s = None
        if not big.path.exists():
            big.path.parent.mkdir(parents=True, exist_ok=True)
            build_s = build(big.path, args.records)
        records = big.head().size if args.reuse else args.records
        # what `orch ledger summary` and `orch ledger verify` run (dictionary-encoded strings for grouping)
        rows, summary_s, load_summary = timed(args.repeat, lambda: summarize(
            big.table(columns_for("run", None), dictionary=True), by="run"))
        by_day, summary_day_s, _ = timed(args.repeat, lambda: summarize(
            big.table(columns_for("day", None), dictionary=True), by="day"))
        report, verify_s, load_verify = timed(args.repeat, big.verify)
        head, head_s, _ = timed(args.repeat, big.head)
        figures["ledger"] = {
            "records": records, "bytes": big.path.stat().st_size, "build_s": build_s,
            "summary_by_run_s": summary_s, "summary_groups": len(rows), "summary_by_day_s": summary_day_s,
            "day_groups": len(by_day), "verify_s": verify_s, "verify_ok": report.ok, "head_s": head_s,
            "head": str(head), "repeat": args.repeat, "load_1min": {"summary": load_summary, "verify": load_verify},
        }
    goals = {"append_p99_ms": 10.0, "summary_s": 1.0, "verify_s": 3.0}
    figures["goals"] = goals
    a, g = figures["append"], figures["ledger"]
    lines = [
        ("append p50 (fsync)", f"{a['p50_ms']:.3f} ms", ""),
        ("append p99 (fsync)", f"{a['p99_ms']:.3f} ms", f"<= {goals['append_p99_ms']} ms"),
        ("append max (fsync)", f"{a['max_ms']:.3f} ms", ""),
        (f"build {g['records']:,} records (no fsync)", "reused" if g["build_s"] is None else f"{g['build_s']:.1f} s",
         f"{g['bytes'] / 1e9:.2f} GB"),
        ("summary --by run", f"{g['summary_by_run_s']:.3f} s", f"<= {goals['summary_s']} s  (median of "
         f"{args.repeat}, load {g['load_1min']['summary']:.2f})"),
        ("summary --by day", f"{g['summary_by_day_s']:.3f} s", f"<= {goals['summary_s']} s"),
        ("verify", f"{g['verify_s']:.3f} s (ok={g['verify_ok']})", f"<= {goals['verify_s']} s  (median of "
         f"{args.repeat}, load {g['load_1min']['verify']:.2f})"),
        ("head (RFC 6962 root)", f"{g['head_s']:.3f} s", ""),
    ]
    width = max(len(x[0]) for x in lines)
    print(f"{'measure':<{width}}  {'value':>24}  goal")
    for name, value, goal in lines:
        print(f"{name:<{width}}  {value:>24}  {goal}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"figures written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
