"""`orch ledger` subcommands: summary (default), list, export, verify, head, repair.

Each prints for humans, returns its JSON document (the CLI prints it with --json) and raises orch errors.
Read-only commands never create a home: a missing ledger is said so, never made.
"""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import typer
from rich.console import Console

from ledger.cost.accounting import FORMATS, columns_for, render_csv, render_table, summarize, summary_document
from ledger.cost.merkle import parse_head
from ledger.cost.store import Ledger
from ledger.render import print_whole
from protocol.errors import FailedError, UsageError
from protocol.home import Home, resolve_home


def _ledger(home: Path | None) -> Ledger:
    return Ledger(resolve_home(home).ledger_path)


def _live(home: Home, run_id: str) -> bool:
    try:
        return home.run_is_live(run_id) is True
    except UsageError:
        return False


def _existing(home: Path | None) -> Ledger:
    """The ledger of `home`; FailedError (one line) when there is none, so the wrong home is never verified."""
    ledger = _ledger(home)
    if not ledger.path.exists():
        raise FailedError(f"no ledger at {ledger.path}: nothing has been recorded there; "
                          "check --home or $ORCH_HOME")
    return ledger


def _say(text: str) -> None:
    typer.echo(text, err=True)


def summary_command(home: Path | None, by: str, since: str | None, fmt: str, *, until: str | None = None,
                    user: str | None = None) -> dict[str, Any]:
    """GPU-seconds, wall seconds, lock wait, package counts and failures per group, and correct totals."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    from ledger.cost.export import ledger_table

    ledger = _ledger(home)
    table = ledger_table(ledger, columns_for(by, since, until), user=user)
    rows = summarize(table, by=by, since=since, until=until)
    tot = (summarize(table, by="all", since=since, until=until) or [{}])[0]
    doc = summary_document(rows, by, since, tot, until)
    if fmt == "json":
        return doc
    if not ledger.path.exists():
        _say(f"no ledger at {ledger.path} (check --home or $ORCH_HOME)")
    if fmt in ("csv", "tsv"):
        typer.echo(render_csv(rows, by, delimiter="," if fmt == "csv" else "\t"), nl=False)
    elif not rows:
        typer.echo(f"no ledger records{' since ' + since if since else ''} in {ledger.path}")
    else:
        print_whole(render_table(rows, by, since, tot), Console(highlight=False))
    return doc


def overhead_command(home: Path | None, runs: list[str]) -> dict[str, Any]:
    """Each run's GPU-seconds beyond its timed launches, and their share (issue 51)."""
    from ledger.cost.overhead import overhead_lines, overhead_total, run_overheads

    ledger = _ledger(home)
    rows = run_overheads(ledger.records() if ledger.path.exists() else [], runs or None)
    missing = sorted(set(runs) - {r["run_id"] for r in rows})
    if missing:
        raise UsageError(f"no package of run {missing[0]} in {ledger.path}; `orch ledger --by run` lists the runs")
    if not rows:
        typer.echo(f"no package records in {ledger.path}")
    for line in overhead_lines(rows) if rows else []:
        typer.echo(line)
    return {"runs": rows, "total": overhead_total(rows)}


def list_command(home: Path | None, fields: str | None, since: str | None, until: str | None, user: str | None,
                 run: str | None, parsable: bool) -> dict[str, Any]:
    """One line per record, sacct-like: chosen fields, time bounds, one user or run."""
    from ledger.cost.export import LIST_DEFAULT, field_help, ledger_table, list_fields, select_records

    if fields is not None and fields.strip().lower() == "help":
        typer.echo(field_help())
        return {"fields": field_help().split()}
    names = list_fields(fields) if fields else list(LIST_DEFAULT)
    ledger = _ledger(home)
    if not ledger.path.exists():
        _say(f"no ledger at {ledger.path} (check --home or $ORCH_HOME)")
    table = select_records(ledger_table(ledger, None, user=user), since=since, until=until, run=run).select(names)
    rows = table.to_pylist()
    cells = [[_cell(r[n]) for n in names] for r in rows]
    if parsable or not sys.stdout.isatty():
        out = io.StringIO()
        writer = csv.writer(out, delimiter="\t", lineterminator="\n")
        writer.writerow(names)
        writer.writerows(cells)
        typer.echo(out.getvalue(), nl=False)
    elif not rows:
        typer.echo(f"no ledger records match in {ledger.path}")
    else:
        from ledger.render import whole_table

        numeric = [pa.types.is_integer(table.schema.field(n).type) or pa.types.is_floating(table.schema.field(n).type)
                   for n in names]
        print_whole(whole_table(names, cells, numeric=numeric), Console(highlight=False))
    return {"fields": names, "records": [{n: _json_value(r[n]) for n in names} for r in rows]}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if hasattr(value, "isoformat"):
        return _iso(value)
    if isinstance(value, float):
        return repr(round(value, 6))
    return str(value)


def _iso(value: Any) -> str:
    return str(value.isoformat(timespec="microseconds")).replace("+00:00", "Z")


def _json_value(value: Any) -> Any:
    return _iso(value) if hasattr(value, "isoformat") else value


def export_command(home: Path | None, to: Path, since: str | None, until: str | None,
                   user: str | None) -> dict[str, Any]:
    """Write Parquet or an Arrow IPC file of the (selected) records, with real UTC timestamps."""
    from ledger.cost.export import export_table, ledger_table, select_records

    ledger = _existing(home)
    table = select_records(ledger_table(ledger, None, user=user), since=since, until=until)
    fmt = export_table(table, to)
    _say(f"exported {table.num_rows} records of {ledger.path} to {to} ({fmt})")
    return {"path": str(to), "format": fmt, "records": table.num_rows, "ledger": str(ledger.path)}


def verify_command(home: Path | None, against: str | None) -> dict[str, Any]:
    """Exit 0 when the ledger verifies (orphans are reported, not failures), 1 with the first bad seq if not."""
    ledger = _existing(home)
    head = parse_head(against) if against else None
    report = ledger.verify(against=head)
    h = resolve_home(home)
    for run_id, package in report.orphaned:
        if _live(h, run_id):
            typer.echo(f"open: run {run_id} package {package} is running (its orch holds the run's owner lock)")
        else:
            typer.echo(f"orphaned: run {run_id} package {package} was opened and never closed (crash or kill)")
    for problem in report.problems:
        typer.echo(f"problem: {problem}")
    if report.ok:
        extra = f"; consistent with head {head}" if head else ""
        typer.echo(f"ok: {report.size} records in {ledger.path}, hash chain and every byte verified{extra}")
    doc: dict[str, Any] = {**report.model_dump(), "ledger": str(ledger.path)}
    if not report.ok:
        raise FailedError(f"{report.message}; {ledger.path}", document=doc)
    return doc


def head_command(home: Path | None) -> dict[str, Any]:
    """Print the RFC 6962 tree head as SIZE:ROOT (publish it; `verify --against` checks growth later)."""
    head = _existing(home).head()
    typer.echo(str(head))
    return head.model_dump()


def repair_command(home: Path | None) -> dict[str, Any]:
    """Move a torn tail aside (never deleted); say where it went, or that there was none."""
    ledger = _existing(home)
    aside = ledger.repair()
    if aside is None:
        typer.echo(f"nothing to repair: {ledger.path} has no torn tail")
    else:
        typer.echo(f"torn tail moved to {aside}; the ledger now ends at its last complete record")
    return {"repaired": aside is not None, "moved_to": None if aside is None else str(aside)}
