"""`orch cache ls | rm`: options parsed here, the commands in orchestrator/cli/cache_commands.py."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import CONTEXT, HomeOpt, JsonOpt, OrchCommand, OrchGroup, examples, report

cache_app = typer.Typer(
    help="The kept baseline compile caches: a later run or A/A launch of the same key loads one instead of priming.",
    epilog=examples("orch cache ls", "orch cache ls --json", "orch cache rm baseline-0123456789abcdef-RUN_ID",
                    "orch cache rm --all --home /data/orch"),
    cls=OrchGroup,
    context_settings=CONTEXT,
    no_args_is_help=True,
)
DirOpt = Annotated[Path | None, typer.Option(
    "--dir", help="a protocol's declared cache folder (launcher.env TORCHINDUCTOR_CACHE_DIR) instead of the home's")]


@cache_app.command("ls", cls=OrchCommand, epilog=examples("orch cache ls", "orch cache ls --dir /data/cc --json"))
def cache_ls(home: HomeOpt = None, folder: DirOpt = None, as_json: JsonOpt = False) -> None:
    """Each kept cache: who sealed it and when, its size, and whether every entry is still as sealed."""
    from orchestrator.cli.cache_commands import ls_command

    report(lambda: ls_command(home, folder), as_json)


@cache_app.command("rm", cls=OrchCommand, epilog=examples("orch cache rm baseline-0123456789abcdef-RUN_ID",
                                                            "orch cache rm --all"))
def cache_rm(
    names: Annotated[list[str] | None, typer.Argument(help="kept caches by name (`orch cache ls`)",
                                                      show_default=False)] = None,
    everything: Annotated[bool, typer.Option("--all", help="every kept cache")] = False,
    home: HomeOpt = None, folder: DirOpt = None, as_json: JsonOpt = False,
) -> None:
    """Free kept caches: the next run of their key primes again."""
    from orchestrator.cli.cache_commands import rm_command

    report(lambda: rm_command(home, folder, list(names or []), everything), as_json)
