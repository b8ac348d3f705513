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

from orchestrator.entry import run_app
from protocol.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_REFUSED, OrchError, os_error_line

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
    except OSError as err:  # e.g. a full disk: one line, exit 1, never a traceback
        typer.echo(f"orch: {os_error_line(err)}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


def _call(fn: Callable[[], T]) -> T:
    with _guard():
        return fn()


def _echo_json(obj: object) -> None:
    typer.echo(json.dumps(obj, sort_keys=True))


def main() -> None:
    """Console-script entry point of `orch`; usage errors are one line (orchestrator.entry)."""
    run_app(app, "orch")


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


@app.command()
def audit(
    run_ids: Annotated[list[str], typer.Argument(help="one run id (runs are never mixed)", metavar="RUN_ID")],
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The verdict of one complete run, or exactly why there is none; then the DEV score, informational."""
    from ledger.audit import audit_command

    _call(lambda: audit_command(run_ids, home, as_json))


@app.command()
def publish(
    run_id: Annotated[str, typer.Argument(help="an audited run")],
    to: Annotated[Path, typer.Option("--to", help="evidence file to write, e.g. docs/validation/NAME.json")],
    home: HomeOpt = None,
) -> None:
    """Write the aggregate evidence of an audited run; refused (exit 3) when it fails hygiene."""
    from ledger.publish import publish_command

    _call(lambda: publish_command(run_id, to, home))


@app.command()
def hygiene(
    paths: Annotated[list[Path], typer.Argument(help="files or directories to scan", metavar="PATH...")],
) -> None:
    """Find what must never be committed or published; exit 3 with one line per finding."""
    from ledger.hygiene import hygiene_command

    _call(lambda: hygiene_command(paths))


@app.command()
def launch(
    protocol: Annotated[Path, typer.Argument(help="protocol.yaml to run")],
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: Annotated[
        float | None, typer.Option("--lock-timeout", help="give up waiting for the GPU lock after S seconds (exit 75)")
    ] = None,
    lock_dir: Annotated[Path | None, typer.Option("--lock-dir", help="host-wide lock directory of gpu-run")] = None,
) -> None:
    """Run the protocol: verified sources, one GPU lock, sealed packages, ledger, then the audit."""
    from orchestrator.launch import LaunchResult, RunFailedError, RunInterruptedError
    from orchestrator.launch import launch as launch_run
    from orchestrator.progress import plain_say

    def run() -> LaunchResult:
        try:
            return launch_run(protocol, home, say=plain_say, lock_timeout=lock_timeout, lock_dir=lock_dir)
        except (RunFailedError, RunInterruptedError) as err:
            typer.echo(err.result.run_id)
            if json_out:
                _echo_json(err.result.as_json())
            raise
        except OrchError as err:
            if json_out:
                _echo_json({"status": "refused" if err.exit_code == EXIT_REFUSED else "failed",
                            "exit_code": err.exit_code, "error": err.message})
            raise

    result = _call(run)
    typer.echo(result.run_id)
    if json_out:
        _echo_json(result.as_json())
    _exit_for_verdict(result.run_id, result.audit)


def _exit_for_verdict(run_id: str, audit_doc: dict[str, object] | None) -> None:
    """`orch launch` ends with the exit code `orch audit` gives the same verdict (ledger.verdict.exit_code)."""
    from ledger.verdict import exit_code

    if audit_doc is None:
        return
    verdict = str(audit_doc.get("verdict"))
    code = exit_code(verdict)
    if code:
        reasons = audit_doc.get("reasons")
        reason = reasons[0] if isinstance(reasons, list) and reasons else verdict
        typer.echo(f"orch: run {run_id}: audit verdict {verdict}: {reason}", err=True)
        raise typer.Exit(code)


@app.command()
def calibrate(
    protocol: Annotated[Path, typer.Argument(help="protocol.yaml whose workload to calibrate")],
    repeats: Annotated[
        int | None, typer.Option("--repeats", min=1, max=32, help="A/A triplets (default: the protocol's repeats)")
    ] = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: Annotated[
        float | None, typer.Option("--lock-timeout", help="give up waiting for the GPU lock after S seconds (exit 75)")
    ] = None,
    lock_dir: Annotated[Path | None, typer.Option("--lock-dir", help="host-wide lock directory of gpu-run")] = None,
) -> None:
    """A/A run (candidate = baseline): this host's noise floor for the workload, recorded in the ledger.

    Example: orch calibrate protocol/r3_mini.yaml --repeats 3
    """
    from ledger.calibration import Calibration
    from orchestrator.calibrate import calibrate as calibrate_run
    from orchestrator.launch import LaunchResult, RunFailedError, RunInterruptedError
    from orchestrator.progress import plain_say

    def run() -> tuple[LaunchResult, Calibration]:
        try:
            return calibrate_run(protocol, repeats, home, say=plain_say, lock_timeout=lock_timeout, lock_dir=lock_dir)
        except (RunFailedError, RunInterruptedError) as err:
            typer.echo(err.result.run_id)
            if json_out:
                _echo_json(err.result.as_json())
            raise

    result, cal = _call(run)
    typer.echo(result.run_id)
    if json_out:
        _echo_json({**result.as_json(), "calibration": cal.model_dump(mode="json", by_alias=True)})


@app.command()
def rehearse(
    protocol: Annotated[Path, typer.Argument(help="the real trainer's protocol, e.g. protocol/r3_bagel7b_8xh100.yaml")],
    upstream: Annotated[Path, typer.Option("--upstream", help="the unmodified upstream R3 source tree")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to rehearse on (policy groups sized to fit)")] = 1,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: Annotated[
        float | None, typer.Option("--lock-timeout", help="give up waiting for the GPU lock after S seconds (exit 75)")
    ] = None,
    compile_cache: Annotated[
        Path | None, typer.Option("--compile-cache", help="keep torch.compile's cache here across rehearsals")
    ] = None,
) -> None:
    """Rehearse before you spend eight GPUs: tiny inputs, loopback judge, the protocol's packages, the audit.

    Example: orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream ../R3 --gpus 1
    """
    from orchestrator.launch import RunFailedError, RunInterruptedError
    from orchestrator.progress import plain_say
    from orchestrator.rehearse import Rehearsal
    from orchestrator.rehearse import rehearse as rehearse_run

    def run() -> Rehearsal:
        try:
            return rehearse_run(protocol, upstream, gpus, home, say=plain_say, lock_timeout=lock_timeout,
                                compile_cache=compile_cache)
        except (RunFailedError, RunInterruptedError) as err:
            typer.echo(err.result.run_id)
            if json_out:
                _echo_json(err.result.as_json())
            raise

    result = _call(run)
    assert result.launch is not None
    typer.echo(result.launch.run_id)
    if json_out:
        _echo_json({**result.launch.as_json(), "rehearsal": str(result.work.name), "judge": result.judge})


ByOpt = Annotated[str, typer.Option("--by", help="group by run|arm|kind|day|protocol")]
SinceOpt = Annotated[str | None, typer.Option("--since", help="only records started at or after DATE (UTC)")]
FormatOpt = Annotated[str, typer.Option("--format", help="table|json|csv")]


@ledger_app.callback(invoke_without_command=True)
def ledger_main(
    ctx: typer.Context, home: HomeOpt = None, by: ByOpt = "kind", since: SinceOpt = None, fmt: FormatOpt = "table",
) -> None:
    """GPU-seconds accounting (the summary) when no subcommand is given."""
    if ctx.invoked_subcommand is None:
        from ledger.commands import summary_command

        _call(lambda: summary_command(home, by, since, fmt))


@ledger_app.command("summary")
def ledger_summary(home: HomeOpt = None, by: ByOpt = "kind", since: SinceOpt = None, fmt: FormatOpt = "table") -> None:
    """GPU-seconds, wall seconds, lock wait, package counts and failures per group."""
    from ledger.commands import summary_command

    _call(lambda: summary_command(home, by, since, fmt))


@ledger_app.command("verify")
def ledger_verify(
    home: HomeOpt = None,
    against: Annotated[str | None, typer.Option("--against", help="a published head SIZE:ROOT")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Hash chain, schema and every byte; with --against, an RFC 6962 proof that the ledger only grew."""
    from ledger.commands import verify_command

    _call(lambda: verify_command(home, against, as_json))


@ledger_app.command("head")
def ledger_head(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """The RFC 6962 tree head SIZE:ROOT over the record hashes."""
    from ledger.commands import head_command

    _call(lambda: head_command(home, as_json))


@ledger_app.command("repair")
def ledger_repair(home: HomeOpt = None) -> None:
    """Move a torn tail aside into a file next to the ledger (never deleted)."""
    from ledger.commands import repair_command

    _call(lambda: repair_command(home))


if __name__ == "__main__":  # pragma: no cover
    main()
