"""What every orch command shares: the error guard (exit codes mapped once), `--json` plumbing and help style.

With `--json` stdout holds exactly one JSON document, on success and on refusal alike; all human text goes to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext, redirect_stdout
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from protocol.errors import EXIT_FAILED, EXIT_INTERRUPTED, OrchError, UsageError, os_error_line

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 120}


def _plain_usage(pieces: list[str]) -> list[str]:
    # typer writes a required argument as {NAME}; the usual convention is NAME required, [NAME] optional
    return [p[1:].replace("}", "", 1) if p.startswith("{") else p for p in pieces]


class OrchCommand(TyperCommand):
    """A typer command whose usage line reads `orch audit [OPTIONS] RUN_ID`."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _plain_usage(super().collect_usage_pieces(ctx))


class OrchGroup(TyperGroup):
    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _plain_usage(super().collect_usage_pieces(ctx))


def examples(*lines: str) -> str:
    """A help epilog of example command lines, one per line in any terminal width."""
    return "Examples:\n\n" + "\n\n".join(f"  $ {line}" for line in lines)


HomeOpt = Annotated[
    Path | None,
    typer.Option("--home", help="orch home (runs/, ledger/, scratch/); default $ORCH_HOME, else ./.orch"),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="stdout: exactly one JSON document; human text goes to stderr")
]


def _emit(stream: IO[str], doc: Any) -> None:
    stream.write(json.dumps(doc, sort_keys=True) + "\n")
    stream.flush()


@contextmanager
def guard(as_json: bool = False, stdout: IO[str] | None = None) -> Iterator[None]:
    """Map orch errors to their exit code and one line on stderr; with --json also one JSON document on stdout."""
    out = stdout if stdout is not None else sys.stdout
    try:
        yield
    except OrchError as err:
        if as_json:
            doc = err.document if err.document is not None else {}
            _emit(out, {"ok": False, "exit_code": err.exit_code, "error": err.message, **doc})
        typer.echo(f"orch: {err.message}", err=True)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        if as_json:
            _emit(out, {"ok": False, "exit_code": EXIT_INTERRUPTED, "error": "interrupted"})
        typer.echo("orch: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except OSError as err:  # e.g. a full disk: one line, exit 1, never a traceback
        line = os_error_line(err)
        if as_json:
            _emit(out, {"ok": False, "exit_code": EXIT_FAILED, "error": line})
        typer.echo(f"orch: {line}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


def call(fn: Callable[[], Any]) -> Any:
    """Run fn under the guard (human output on stdout)."""
    with guard():
        return fn()


def report(fn: Callable[[], Any], as_json: bool) -> None:
    """Run a reporting command: fn prints for humans and returns its JSON document.

    With --json everything fn prints goes to stderr and the document alone to stdout.
    """
    real = sys.stdout
    with guard(as_json, real), redirect_stdout(sys.stderr) if as_json else nullcontext():
        doc = fn()
    if as_json:
        _emit(real, doc)


OPTION_NAMES = {"fmt": "--format", "as_json": "--json"}  # parameter name -> the option a user typed


def refuse_misplaced(command: str, given: dict[str, Any], accepted: tuple[str, ...]) -> None:
    """Group options that a subcommand does not take are refused, never silently ignored."""
    wrong = [name for name, value in given.items() if value is not None and name not in accepted]
    if wrong:
        opts = ", ".join(OPTION_NAMES.get(n, f"--{n.replace('_', '-')}") for n in wrong)
        with guard():
            raise UsageError(f"{opts} does not apply to `orch ledger {command}`; see `orch ledger {command} -h`")
