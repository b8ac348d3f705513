"""Runs a typer app so that every usage error is one line (what is wrong, where to look) with exit 2.

click's own report is a usage block and a boxed message; DESIGN.md section 4 asks for one line per refusal.
"""

from __future__ import annotations

import json
import sys
from typing import NoReturn

import typer

from protocol.errors import EXIT_INTERRUPTED, EXIT_USAGE


def _asks_json(argv: list[str]) -> bool:
    """Whether --json was given to orch itself (not after `--`, where gpu-run's command starts)."""
    return "--json" in (argv[: argv.index("--")] if "--" in argv else argv)


def run_app(app: typer.Typer, prog_name: str) -> NoReturn:
    try:
        code = app(prog_name=prog_name, standalone_mode=False)
    except typer.Abort:
        typer.echo(f"{prog_name}: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:
        # click's exceptions (typer may vendor click): a message and an exit code, instead of a usage box
        message, exit_code = getattr(err, "format_message", None), getattr(err, "exit_code", None)
        if type(err).__name__ == "NoArgsIsHelpError":
            app(prog_name=prog_name)  # the help, as typer shows it, and its exit status
        if not callable(message) or not isinstance(exit_code, int):
            raise
        ctx = getattr(err, "ctx", None)
        where = ctx.command_path if ctx is not None else prog_name
        hint = f"; see `{where} --help`" if exit_code == EXIT_USAGE else ""
        line = f"{where}: {str(message()).rstrip('.')}{hint}"
        if _asks_json(sys.argv[1:]):  # --json promises one document on stdout, refusals of the parser included
            typer.echo(json.dumps({"ok": False, "exit_code": exit_code, "error": line}, sort_keys=True))
        typer.echo(line, err=True)
        sys.exit(exit_code)
    sys.exit(code if isinstance(code, int) else 0)
