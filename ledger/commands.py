"""`orch ledger` subcommands: summary (default), verify, head, repair; each prints and raises orch errors.

The CLI only parses options and calls one of these inside its error guard.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from ledger.accounting import FORMATS, columns_for, render_csv, render_json, render_table, summarize
from ledger.store import Ledger, parse_head
from protocol.errors import FailedError, UsageError
from protocol.home import Home, resolve_home


def _ledger(home: Path | None) -> Ledger:
    return Ledger(resolve_home(home).ledger_path)


def _live(home: Home, run_id: str) -> bool:
    try:
        return home.run_is_live(run_id) is True
    except UsageError:
        return False


def summary_command(home: Path | None, by: str, since: str | None, fmt: str) -> None:
    """GPU-seconds, wall seconds, lock wait, package counts and failures per group."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    ledger = _ledger(home)
    rows = summarize(ledger.table(columns_for(by, since), dictionary=True), by=by, since=since)
    if fmt == "json":
        typer.echo(render_json(rows, by, since))
    elif fmt == "csv":
        typer.echo(render_csv(rows, by), nl=False)
    elif not rows:
        typer.echo(f"no ledger records{' since ' + since if since else ''} in {ledger.path}")
    else:
        Console(soft_wrap=not sys.stdout.isatty()).print(render_table(rows, by, since))


def verify_command(home: Path | None, against: str | None, as_json: bool) -> None:
    """Exit 0 when the ledger verifies (orphans are reported, not failures), 1 with the first bad seq if not."""
    ledger = _ledger(home)
    head = parse_head(against) if against else None
    report = ledger.verify(against=head)
    if as_json:
        typer.echo(json.dumps(report.model_dump(), sort_keys=True))
    else:
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
            typer.echo(f"ok: {report.size} records, hash chain and every byte verified{extra}")
    if not report.ok:
        raise FailedError(f"{report.message}; {ledger.path}")


def head_command(home: Path | None, as_json: bool) -> None:
    """Print the RFC 6962 tree head as SIZE:ROOT (publish it; `verify --against` checks growth later)."""
    head = _ledger(home).head()
    typer.echo(json.dumps(head.model_dump(), sort_keys=True) if as_json else str(head))


def repair_command(home: Path | None) -> None:
    """Move a torn tail aside (never deleted); say where it went, or that there was none."""
    ledger = _ledger(home)
    aside = ledger.repair()
    if aside is None:
        typer.echo(f"nothing to repair: {ledger.path} has no torn tail")
    else:
        typer.echo(f"torn tail moved to {aside}; the ledger now ends at its last complete record")
