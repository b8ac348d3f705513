"""GPU-seconds accounting over the ledger: group close records by run, arm, kind, day or protocol.

Vectorised with pyarrow compute, so a summary of a million records takes well under a second.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from rich.table import Table

from ledger.record import FAILURES, LedgerRecord, utc_iso
from protocol.errors import UsageError

By = Literal["run", "arm", "kind", "day", "protocol"]
BY_CHOICES: tuple[str, ...] = ("run", "arm", "kind", "day", "protocol")
FORMATS: tuple[str, ...] = ("table", "json", "csv")
SUMMARY_COLUMNS = ["seq", "run_id", "package", "kind", "arm", "status", "started", "ended", "wall_s",
                   "gpu_seconds", "lock_wait_s", "protocol_id"]
FIGURES = ("runs", "packages", "ok", "failed", "not_run", "open", "gpu_seconds", "wall_s", "lock_wait_s")


def columns_for(by: str, since: str | None) -> list[str]:
    """The ledger columns a summary by `by` (and `since`) reads; fewer columns, faster on a big ledger."""
    cols = ["seq", "run_id", "package", "status", "wall_s", "gpu_seconds", "lock_wait_s"]
    extra = {"kind": ["kind"], "arm": ["arm"], "protocol": ["protocol_id"], "day": ["started", "ended"]}.get(by, [])
    if since is not None:
        extra = [*extra, "started", "ended"]
    return cols + [c for c in dict.fromkeys(extra) if c not in cols]


def parse_since(text: str | None) -> str | None:
    """`--since` as a comparable UTC prefix: a date (YYYY-MM-DD) or a UTC ISO 8601 time."""
    if text is None:
        return None
    try:
        return date.fromisoformat(text).isoformat()
    except ValueError:
        pass
    try:
        return utc_iso(text)
    except ValueError as err:
        raise UsageError(f"--since {text!r} is neither a date (YYYY-MM-DD) nor a UTC time (…Z)") from err


def _as_table(records: pa.Table | Sequence[LedgerRecord]) -> pa.Table:
    if isinstance(records, pa.Table):
        return records
    rows = [r.model_dump(include=set(SUMMARY_COLUMNS)) for r in records]
    from ledger.record import SCHEMA

    schema = pa.schema([SCHEMA.field(name) for name in SUMMARY_COLUMNS])
    return pa.Table.from_pylist(rows, schema=schema)


def _unclosed(t: pa.Table) -> pa.Array:
    """True for open records with no later close of the same (run_id, package)."""
    is_open = pc.equal(t["status"], "open")
    keys = pa.table({"run_id": t["run_id"], "package": t["package"], "seq": t["seq"], "row": pa.array(range(len(t)))})
    closes = keys.filter(pc.invert(is_open)).group_by(["run_id", "package"]).aggregate([("seq", "max")])
    opens = keys.filter(is_open).join(closes, keys=["run_id", "package"], join_type="left outer")
    later = pc.fill_null(pc.greater(opens["seq_max"], opens["seq"]), False)
    rows = opens.filter(pc.invert(later))["row"]
    return pc.is_in(keys["row"], value_set=rows.combine_chunks() if rows.num_chunks else pa.array([], pa.int64()))


def summarize(
    records: pa.Table | Sequence[LedgerRecord], by: str = "kind", since: str | None = None
) -> list[dict[str, Any]]:
    """One row per group: runs, packages closed, ok / failed / not-run / still-open counts, GPU-s, wall-s, lock wait.

    GPU and wall seconds come from close records; lock wait is counted once per run (every record of a run
    carries the run's single lock wait); `since` keeps records started (or ended) at or after it.
    """
    if by not in BY_CHOICES:
        raise UsageError(f"--by {by!r} is not one of {', '.join(BY_CHOICES)}")
    t = _as_table(records)
    cutoff = parse_since(since)
    if cutoff is not None:
        when = pc.coalesce(t["started"], t["ended"])
        t = t.filter(pc.fill_null(pc.greater_equal(when, cutoff), False))
    if t.num_rows == 0:
        return []
    if by == "day":
        key = pc.fill_null(pc.utf8_slice_codeunits(pc.coalesce(t["started"], t["ended"]), 0, 10), "-")
    elif by == "arm":
        key = pc.fill_null(t["arm"], "-")
    else:
        key = t[{"run": "run_id", "kind": "kind", "protocol": "protocol_id"}[by]]
    status = t["status"]
    closed = pc.not_equal(status, "open")

    def count(mask: Any) -> Any:
        return pc.cast(mask, pa.int64())

    def closed_sum(col: str) -> Any:
        return pc.if_else(closed, pc.fill_null(t[col], 0.0), 0.0)

    work = pa.table({
        "key": key, "run_id": t["run_id"],
        "packages": count(closed), "ok": count(pc.equal(status, "ok")),
        "failed": count(pc.is_in(status, value_set=pa.array(FAILURES))),
        "not_run": count(pc.equal(status, "not-run")), "open": count(_unclosed(t)),
        "gpu_seconds": closed_sum("gpu_seconds"), "wall_s": closed_sum("wall_s"),
        "lock_wait_s": pc.fill_null(t["lock_wait_s"], 0.0),
    })
    sums = work.group_by("key").aggregate(
        [(c, "sum") for c in ("packages", "ok", "failed", "not_run", "open", "gpu_seconds", "wall_s")]
        + [("run_id", "count_distinct")]
    )
    waits = (work.group_by(["key", "run_id"]).aggregate([("lock_wait_s", "max")])
             .group_by("key").aggregate([("lock_wait_s_max", "sum")]))
    wait_of = dict(zip(waits["key"].to_pylist(), waits["lock_wait_s_max_sum"].to_pylist(), strict=True))
    rows = []
    for r in sums.to_pylist():
        rows.append({
            by: r["key"], "runs": r["run_id_count_distinct"], "packages": r["packages_sum"], "ok": r["ok_sum"],
            "failed": r["failed_sum"], "not_run": r["not_run_sum"], "open": r["open_sum"],
            "gpu_seconds": round(r["gpu_seconds_sum"], 6), "wall_s": round(r["wall_s_sum"], 6),
            "lock_wait_s": round(wait_of[r["key"]], 6),
        })
    return sorted(rows, key=lambda row: str(row[by]))


def total(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Column sums of summary rows (runs are summed too: a run counted in two groups counts twice)."""
    return {f: round(sum(r[f] for r in rows), 6) if isinstance(rows[0][f], float) else sum(r[f] for r in rows)
            for f in FIGURES} if rows else dict.fromkeys(FIGURES, 0)


def render_json(rows: Sequence[dict[str, Any]], by: str, since: str | None) -> str:
    return json.dumps({"by": by, "since": parse_since(since), "groups": list(rows), "total": total(rows)},
                      sort_keys=True)


def render_csv(rows: Sequence[dict[str, Any]], by: str) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[by, *FIGURES], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def render_table(rows: Sequence[dict[str, Any]], by: str, since: str | None = None) -> Table:
    """A rich table with a total row; GPU-hours beside GPU-seconds because people budget in hours."""
    title = f"GPU cost by {by}" + (f" since {parse_since(since)}" if since else "")
    table = Table(title=title, show_footer=bool(rows))
    tot = total(rows)
    table.add_column(by, footer="total")
    for f in FIGURES:
        foot = f"{tot[f]:,.1f}" if isinstance(tot[f], float) else f"{tot[f]:,}"
        table.add_column(f.replace("_", " "), justify="right", footer=foot)
    table.add_column("GPU-h", justify="right", footer=f"{tot['gpu_seconds'] / 3600:,.2f}")
    for r in rows:
        cells = [f"{r[f]:,.1f}" if isinstance(r[f], float) else f"{r[f]:,}" for f in FIGURES]
        table.add_row(str(r[by]), *cells, f"{r['gpu_seconds'] / 3600:,.2f}")
    return table
