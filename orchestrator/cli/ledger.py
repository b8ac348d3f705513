"""`orch ledger` and its subcommands: options parsed here, one function per command in ledger.cost.commands.

Options given to the group (`orch ledger --home X head`) apply to the subcommand, or are refused in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.common import (
    CONTEXT,
    HomeOpt,
    JsonOpt,
    OrchCommand,
    OrchGroup,
    examples,
    refuse_misplaced,
    report,
)

ledger_app = typer.Typer(
    help="Accounting and integrity of the GPU-seconds ledger; with no subcommand, the summary.",
    epilog=examples(
        "orch ledger",
        "orch ledger --home /data/orch --by run --since 2026-06-01",
        "orch ledger list --format run_id,package,status,gpu_seconds,user --parsable",
        "orch ledger export --to ledger.parquet",
        "orch ledger --home /data/orch verify --against 1204:3f0c...",
    ),
    cls=OrchGroup,
    context_settings=CONTEXT,
    no_args_is_help=False,
)

ByOpt = Annotated[str | None, typer.Option("--by", help="group by run|arm|kind|day|protocol|user [default: kind]")]
SinceOpt = Annotated[
    str | None, typer.Option("--since", help="records started at or after DATE or TIME (UTC, e.g. 2026-06-01)")
]
UntilOpt = Annotated[str | None, typer.Option("--until", help="records started before DATE or TIME (UTC)")]
UserOpt = Annotated[str | None, typer.Option("--user", help="only records of this login name")]
FormatOpt = Annotated[str | None, typer.Option("--format", help="table|json|csv|tsv [default: table]")]


def _group(ctx: typer.Context) -> dict[str, Any]:
    obj = ctx.obj if isinstance(ctx.obj, dict) else {}
    return dict(obj)


def _merge(ctx: typer.Context, command: str, accepted: tuple[str, ...], **mine: Any) -> dict[str, Any]:
    """The subcommand's own options, completed by the group's; group options it does not take are refused."""
    given = _group(ctx)
    refuse_misplaced(command, given, accepted)
    merged = dict(mine)
    for name, value in given.items():
        if value is not None and merged.get(name) in (None, False):
            merged[name] = value
    return merged


@ledger_app.callback(invoke_without_command=True)
def ledger_main(
    ctx: typer.Context,
    home: HomeOpt = None,
    by: ByOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    user: UserOpt = None,
    fmt: FormatOpt = None,
    as_json: Annotated[bool | None, typer.Option("--json", help="stdout: exactly one JSON document",
                                                 show_default=False)] = None,
) -> None:
    """GPU-seconds accounting (the summary) when no subcommand is given; group options apply to subcommands."""
    ctx.obj = {"home": home, "by": by, "since": since, "until": until, "user": user, "fmt": fmt,
               "as_json": as_json or None}
    if ctx.invoked_subcommand is None:
        _summary(home, by, since, until, user, fmt, bool(as_json))


def _summary(home: Path | None, by: str | None, since: str | None, until: str | None, user: str | None,
             fmt: str | None, as_json: bool) -> None:
    from ledger.cost.commands import summary_command

    if as_json:
        fmt = "json"
    report(lambda: summary_command(home, by or "kind", since, fmt or "table", until=until, user=user),
           as_json or fmt == "json")


SUMMARY_OPTS = ("home", "by", "since", "until", "user", "fmt", "as_json")


@ledger_app.command(
    "summary", cls=OrchCommand,
    epilog=examples("orch ledger summary --by day --since 2026-06-01", "orch ledger summary --by user --json"),
)
def ledger_summary(ctx: typer.Context, home: HomeOpt = None, by: ByOpt = None, since: SinceOpt = None,
                   until: UntilOpt = None, user: UserOpt = None, fmt: FormatOpt = None,
                   as_json: JsonOpt = False) -> None:
    """GPU-seconds, wall seconds, lock wait, package counts and failures per group."""
    o = _merge(ctx, "summary", SUMMARY_OPTS, home=home, by=by, since=since, until=until, user=user, fmt=fmt,
               as_json=as_json)
    _summary(o["home"], o["by"], o["since"], o["until"], o["user"], o["fmt"], bool(o["as_json"]))


@ledger_app.command(
    "list", cls=OrchCommand,
    epilog=examples(
        "orch ledger list --since 2026-06-01 --user alice",
        "orch ledger list --format seq,run_id,package,status,started,gpu_seconds --parsable > jobs.tsv",
        "orch ledger list --run RUN_ID --json | python -m json.tool",
    ),
)
def ledger_list(
    ctx: typer.Context,
    home: HomeOpt = None,
    fields: Annotated[str | None, typer.Option("--format", help="comma-separated fields (like sacct --format); "
                                                                 "`--format help` lists them")] = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    user: UserOpt = None,
    run: Annotated[str | None, typer.Option("--run", help="only the records of this run id")] = None,
    parsable: Annotated[bool, typer.Option("--parsable", help="tab-separated with a header, nothing cut")] = False,
    as_json: JsonOpt = False,
) -> None:
    """One line per ledger record (open and close records), like Slurm's sacct."""
    from ledger.cost.commands import list_command

    o = _merge(ctx, "list", ("home", "since", "until", "user", "as_json"), home=home, since=since, until=until,
               user=user, as_json=as_json)
    report(lambda: list_command(o["home"], fields, o["since"], o["until"], o["user"], run, parsable),
           bool(o["as_json"]))


@ledger_app.command(
    "export", cls=OrchCommand,
    epilog=examples(
        "orch ledger export --to ledger.parquet",
        "orch ledger export --to ledger.arrow --since 2026-06-01",
        "python -c \"import pandas; print(pandas.read_parquet('ledger.parquet'))\"",
    ),
)
def ledger_export(
    ctx: typer.Context,
    to: Annotated[Path, typer.Option("--to", help="FILE.parquet, or FILE.arrow / FILE.feather (Arrow IPC file)")],
    home: HomeOpt = None,
    since: SinceOpt = None,
    until: UntilOpt = None,
    user: UserOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the ledger as Parquet or an Arrow IPC file (real UTC timestamps) for pandas, polars, DuckDB."""
    from ledger.cost.commands import export_command

    o = _merge(ctx, "export", ("home", "since", "until", "user", "as_json"), home=home, since=since, until=until,
               user=user, as_json=as_json)
    report(lambda: export_command(o["home"], to, o["since"], o["until"], o["user"]), bool(o["as_json"]))


@ledger_app.command(
    "verify", cls=OrchCommand,
    epilog=examples("orch ledger verify", "orch ledger --home /data/orch verify --against 1204:3f0c... --json"),
)
def ledger_verify(
    ctx: typer.Context,
    home: HomeOpt = None,
    against: Annotated[str | None, typer.Option("--against", help="a published head SIZE:ROOT")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hash chain, schema and every byte; with --against, an RFC 6962 proof that the ledger only grew."""
    from ledger.cost.commands import verify_command

    o = _merge(ctx, "verify", ("home", "as_json"), home=home, as_json=as_json)
    report(lambda: verify_command(o["home"], against), bool(o["as_json"]))


@ledger_app.command(
    "reconcile", cls=OrchCommand,
    epilog=examples("orch ledger reconcile", "orch ledger --home /data/orch reconcile --json"),
)
def ledger_reconcile(ctx: typer.Context, home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Slurm runs: each package's GPU-seconds in the ledger against sacct (gres/gpu x elapsed of its steps)."""
    from orchestrator.slurm.accounting import reconcile

    o = _merge(ctx, "reconcile", ("home", "as_json"), home=home, as_json=as_json)
    report(lambda: reconcile(o["home"]), bool(o["as_json"]))


@ledger_app.command(
    "overhead", cls=OrchCommand,
    epilog=examples("orch ledger overhead", "orch ledger overhead RUN_ID --json", "orch ledger overhead RUN1 RUN2"),
)
def ledger_overhead(
    ctx: typer.Context,
    runs: Annotated[list[str] | None, typer.Argument(help="run ids (default: every run)", show_default=False)] = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Proof overhead: each run's GPU-seconds beyond its timed A, C, B launches, and their share."""
    from ledger.cost.commands import overhead_command

    o = _merge(ctx, "overhead", ("home", "as_json"), home=home, as_json=as_json)
    report(lambda: overhead_command(o["home"], list(runs or [])), bool(o["as_json"]))


@ledger_app.command("head", cls=OrchCommand, epilog=examples("orch ledger head", "orch ledger --home X head --json"))
def ledger_head(ctx: typer.Context, home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """The RFC 6962 tree head SIZE:ROOT over the record hashes."""
    from ledger.cost.commands import head_command

    o = _merge(ctx, "head", ("home", "as_json"), home=home, as_json=as_json)
    report(lambda: head_command(o["home"]), bool(o["as_json"]))


@ledger_app.command("repair", cls=OrchCommand, epilog=examples("orch ledger repair", "orch ledger --home X repair"))
def ledger_repair(ctx: typer.Context, home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Move a torn tail aside into a file next to the ledger (never deleted)."""
    from ledger.cost.commands import repair_command

    o = _merge(ctx, "repair", ("home", "as_json"), home=home, as_json=as_json)
    report(lambda: repair_command(o["home"]), bool(o["as_json"]))
