"""Command line of orch: parses arguments and calls one function per command (DESIGN.md section 4).

Errors are mapped to exit codes in exactly one place, `_guard`; every refusal is one line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from protocol.errors import EXIT_INTERRUPTED, OrchError

T = TypeVar("T")

app = typer.Typer(
    name="orch",
    help="Frozen-protocol experiment orchestrator: freeze sources, launch sealed runs, audit the evidence.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
ledger_app = typer.Typer(help="Accounting and integrity of the GPU-seconds ledger.", no_args_is_help=False)
app.add_typer(ledger_app, name="ledger")


@contextmanager
def _guard() -> Iterator[None]:
    """Map orch errors to their exit code and one line on stderr."""
    try:
        yield
    except OrchError as err:
        typer.echo(f"orch: {err.message}", err=True)
        raise typer.Exit(err.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("orch: interrupted", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _call(fn: Callable[[], T]) -> T:
    with _guard():
        return fn()


def _echo_json(obj: object) -> None:
    typer.echo(json.dumps(obj, sort_keys=True))


def main() -> None:
    """Console-script entry point of `orch`."""
    app(prog_name="orch")


HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="orch home (runs/, ledger/, scratch/); default $ORCH_HOME or ./.orch")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object last")]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
