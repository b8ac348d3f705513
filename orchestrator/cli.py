"""Command line of orch: parses arguments and calls one function per command (DESIGN.md section 4).

Errors are mapped to exit codes in exactly one place, `_guard`; every refusal is one line.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, TypeVar

import typer

from protocol.errors import EXIT_INTERRUPTED, EXIT_REFUSED, OrchError

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


@app.command()
def freeze(
    root: Annotated[Path | None, typer.Argument(help="root of the sources to hash")] = None,
    include: Annotated[list[str] | None, typer.Option("--include", "-i", help="glob relative to ROOT")] = None,
    protocol: Annotated[Path | None, typer.Option("--protocol", help="hash the sources of this protocol")] = None,
    arm: Annotated[str, typer.Option("--arm", help="baseline or candidate (with --protocol)")] = "baseline",
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the manifest here")] = None,
    fmt: Annotated[str, typer.Option("--format", help="json or sha256sum")] = "json",
) -> None:
    """Hash runtime sources into a SHA256 manifest (the commitment to publish)."""
    from manifests.commands import freeze as freeze_sources

    typer.echo(_call(lambda: freeze_sources(root, include or [], protocol, arm, output, fmt)))


@app.command()
def verify(
    commitment: Annotated[Path, typer.Argument(help="published manifest (JSON)")],
    root: Annotated[Path | None, typer.Option("--root", help="tree to check (default: current directory)")] = None,
) -> None:
    """Exit 0 when the tree matches the commitment, 3 with a diff when not."""
    from manifests.commands import verify as verify_sources

    ok, text = _call(lambda: verify_sources(commitment, root))
    typer.echo(text, err=not ok)
    if not ok:
        raise typer.Exit(EXIT_REFUSED)


@app.command()
def schema() -> None:
    """Print the JSON Schema of protocol.yaml (for editor completion)."""
    from manifests.commands import schema_text

    typer.echo(schema_text())


HomeOpt = Annotated[
    Path | None, typer.Option("--home", help="orch home (runs/, ledger/, scratch/); default $ORCH_HOME or ./.orch")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object last")]

if __name__ == "__main__":  # pragma: no cover
    main()
