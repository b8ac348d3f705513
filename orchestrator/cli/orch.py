"""Command line of orch: parses arguments and calls one function per command (DESIGN.md section 4).

Errors are mapped to exit codes in exactly one place (`cli_common.guard`); every refusal is one line.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Annotated, Any

import typer

from orchestrator.cli.cache import cache_app
from orchestrator.cli.common import CONTEXT, HomeOpt, JsonOpt, OrchCommand, OrchGroup, examples, guard, report
from orchestrator.cli.entry import run_app
from orchestrator.cli.init import INIT_EXAMPLES
from orchestrator.cli.init import init as init_command
from orchestrator.cli.ledger import ledger_app
from protocol.errors import FailedError, UsageError
from protocol.plan import DEFAULT_MAX_REPEATS, MAX_REPEATS

app = typer.Typer(
    name="orch",
    help="Frozen-protocol experiment orchestrator: freeze sources, launch sealed runs, audit the evidence.",
    epilog=examples(
        "orch freeze examples/r3_mini --include 'modeling/**/*.py' 'train/**/*.py' -o manifests/r3_mini.json",
        "orch launch protocol/r3_mini.yaml",
        "orch audit RUN_ID --json | python -m json.tool",
        "orch ledger --by run",
    ),
    cls=OrchGroup,
    context_settings=CONTEXT,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(ledger_app, name="ledger")
app.add_typer(cache_app, name="cache")
app.command(name="init", cls=OrchCommand, epilog=INIT_EXAMPLES)(init_command)
# checked while parsing (one usage line, exit 2), before any run folder, ledger record or lock exists
LockTimeoutOpt = Annotated[
    float | None,
    typer.Option("--lock-timeout", min=0.0, help="give up waiting for the GPU lock after S seconds (exit 75)"),
]


def orch_version() -> str:
    try:
        return package_version("orch")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"orch {orch_version()}")
        raise typer.Exit(0)


@app.callback()
def orch_main(
    version: Annotated[
        bool, typer.Option("--version", help="print the version and exit", callback=_show_version, is_eager=True)
    ] = False,
) -> None:
    """Frozen-protocol experiment orchestrator: freeze sources, launch sealed runs, audit the evidence.

    Exit codes: 0 ok; 1 a package or the audit failed (any verdict but accepted); 2 usage; 3 refused before any
    GPU time (protocol, manifest, hygiene); 75 lock not obtained in time; 130 interrupted.
    """


def main() -> None:
    """Console-script entry point of `orch`; usage errors are one line (orchestrator.cli.entry)."""
    run_app(app, "orch")


@app.command(
    cls=OrchCommand,
    epilog=examples(
        "orch freeze examples/r3_mini --include 'modeling/**/*.py' 'train/**/*.py' -o manifests/r3_mini.json",
        "orch freeze src -i '**/*.py' --format sha256sum -o SHA256SUMS",
        "orch freeze --protocol protocol/r3_mini.yaml --arm candidate -o manifests/candidate.json",
    ),
)
def freeze(
    root: Annotated[Path | None, typer.Argument(help="root of the sources to hash", show_default=False)] = None,
    globs: Annotated[
        list[str] | None,
        typer.Argument(metavar="[GLOB]...", help="more globs: `--include a b` takes both", show_default=False),
    ] = None,
    include: Annotated[
        list[str] | None, typer.Option("--include", "-i", help="glob relative to ROOT (`**/` spans folders)")
    ] = None,
    protocol: Annotated[Path | None, typer.Option("--protocol", help="hash the sources of this protocol")] = None,
    arm: Annotated[str, typer.Option("--arm", help="baseline or candidate (with --protocol)")] = "baseline",
    output: Annotated[Path | None, typer.Option("-o", "--output", help="write the manifest here")] = None,
    fmt: Annotated[str, typer.Option("--format", help="json or sha256sum")] = "json",
    as_json: JsonOpt = False,
) -> None:
    """Hash runtime sources into a SHA256 manifest (the commitment to publish)."""
    from manifests.commands import freeze_command

    report(lambda: freeze_command(root, [*(include or []), *(globs or [])], protocol, arm, output, fmt), as_json)


@app.command(
    cls=OrchCommand,
    epilog=examples(
        "orch verify manifests/r3_mini.json",
        "orch verify manifests/r3_mini.json --root examples/r3_mini --json",
    ),
)
def verify(
    commitment: Annotated[Path, typer.Argument(help="published manifest (JSON)", show_default=False)],
    root: Annotated[
        Path | None,
        typer.Option("--root", help="tree to check (default: the manifest's recorded sources root, else the "
                                    "current directory)"),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Exit 0 when the tree matches the commitment, 3 with a diff when not."""
    from manifests.commands import verify_command

    report(lambda: verify_command(commitment, root), as_json)


@app.command(
    cls=OrchCommand,
    epilog=examples("orch schema > protocol.schema.json", "orch schema --kind audit | python -m json.tool"),
)
def schema(
    kind: Annotated[str, typer.Option(
        "--kind", help="protocol | recipe | audit | calibration | evidence | gpu-run | ledger-record")] = "protocol",
) -> None:
    """Print a JSON Schema: protocol.yaml (for editor completion), a recipe file, audit.json, calibration.json,
    evidence, gpu-run record, ledger record."""
    from orchestrator.cli.schemas import schema_document

    report(lambda: schema_document(kind), True)


@app.command(
    cls=OrchCommand,
    context_settings={**CONTEXT, "allow_extra_args": True},
    epilog=examples("orch audit 20261201T121500Z-3844cbb9-ab12", "orch audit RUN_ID --json | python -m json.tool"),
)
def audit(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="one run id (runs are never mixed)",
                                          show_default=False)],
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The verdict of one complete run (the paired interval over its triplets, pooled with this host's A/A
    calibration), or exactly why there is none; then the DEV score, informational.

    Exit 0 for accepted or no difference shown, 1 for not exact or when there is no audit (the same as launch).
    """
    from ledger.verdict.documents.audit import MIX_REFUSAL, audit_command

    def run() -> dict[str, Any]:
        if ctx.args:
            raise UsageError(f"audit takes exactly one RUN_ID, got {1 + len(ctx.args)}: {MIX_REFUSAL}")
        return audit_command(run_id, home)

    report(run, as_json)


@app.command(
    cls=OrchCommand,
    epilog=examples("orch publish RUN_ID --to docs/validation/r3_mini_cpu.json"),
)
def publish(
    run_id: Annotated[str, typer.Argument(metavar="RUN_ID", help="an audited run", show_default=False)],
    to: Annotated[Path, typer.Option("--to", help="evidence file to write, e.g. docs/validation/NAME.json")],
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the aggregate evidence of an audited run; refused (exit 3) when it fails hygiene."""
    from ledger.files.publish import publish_command

    report(lambda: publish_command(run_id, to, home), as_json)


@app.command(
    cls=OrchCommand,
    epilog=examples("orch hygiene docs/validation", "git diff --name-only main | xargs orch hygiene --json"),
)
def hygiene(
    paths: Annotated[list[Path], typer.Argument(help="files or directories to scan", metavar="PATH...",
                                                show_default=False)],
    as_json: JsonOpt = False,
) -> None:
    """Find what must never be committed or published; exit 3 with one line per finding."""
    from ledger.files.hygiene import hygiene_command

    report(lambda: hygiene_command(paths), as_json)


@app.command(
    cls=OrchCommand,
    epilog=examples(
        "orch launch protocol/r3_mini.yaml",
        "orch launch protocol/r3_mini_cuda2.yaml --lock-timeout 600 --json > run.json",
        "orch launch protocol/r3_mini.yaml --until-decided --max-repeats 6",
    ),
)
def launch(
    protocol: Annotated[Path, typer.Argument(help="protocol.yaml to run", show_default=False)],
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: LockTimeoutOpt = None,
    lock_dir: Annotated[Path | None, typer.Option("--lock-dir", help="host-wide lock directory of gpu-run")] = None,
    until_decided: Annotated[bool, typer.Option(
        "--until-decided", help="add triplets one at a time until the sequential rule stops (decided, precise or "
        "--max-repeats), as measurement.repeats: auto does; recorded in run.json")] = False,
    max_repeats: Annotated[int | None, typer.Option(
        "--max-repeats", min=1, max=MAX_REPEATS,
        help=f"with --until-decided: the most triplets (default {DEFAULT_MAX_REPEATS})")] = None,
) -> None:
    """Run the protocol: verified sources, one GPU lock, sealed packages, ledger, then the audit.

    Prints the run id. Exit 0 when the verdict is accepted, 1 for any other verdict or a failed package.
    A protocol with launcher.scheduler slurm started outside an allocation runs itself again under salloc.
    """
    from orchestrator.slurm.cluster import needs_allocation, rerun_in_allocation

    slurm = needs_allocation(protocol)
    if slurm is not None:  # the inner orch prints the run id and the JSON document; refusals of salloc here
        with guard(json_out):
            code = rerun_in_allocation(slurm, protocol, lock_timeout)
        raise typer.Exit(code)
    if max_repeats is not None and not until_decided:
        with guard(json_out):
            raise UsageError("--max-repeats goes with --until-decided; add --until-decided or drop --max-repeats")
    until = (max_repeats or DEFAULT_MAX_REPEATS) if until_decided else None
    report(lambda: launch_command(protocol, home, lock_timeout, lock_dir, until), json_out)


@app.command(
    cls=OrchCommand,
    epilog=examples(
        "orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream ../R3 --gpus 1",
        "orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream ../R3 --json | python -m json.tool",
        "orch rehearse protocol/r3_bagel7b_8xh100.yaml --upstream ../R3 --calibrate 3",
    ),
)
def rehearse(
    protocol: Annotated[Path, typer.Argument(help="the real trainer's protocol, e.g. protocol/r3_bagel7b_8xh100.yaml",
                                             show_default=False)],
    upstream: Annotated[Path, typer.Option("--upstream", help="the unmodified upstream R3 source tree")],
    gpus: Annotated[int, typer.Option("--gpus", help="GPUs to rehearse on (policy groups sized to fit)")] = 1,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: LockTimeoutOpt = None,
    compile_cache: Annotated[
        Path | None, typer.Option("--compile-cache", help="make the run's compile caches (the prime's sealed "
                                                          "baseline cache) in this folder and keep them after the run")
    ] = None,
    calibrate_repeats: Annotated[
        int | None, typer.Option("--calibrate", min=1, max=32, help="calibrate the rehearsal instead of launching it: "
                                 "K A/A launches (orch calibrate), at least 2")
    ] = None,
) -> None:
    """Rehearse before you spend eight GPUs: tiny inputs, loopback judge, the protocol's packages, the audit."""
    report(lambda: rehearse_command(protocol, upstream, gpus, home, lock_timeout, compile_cache, calibrate_repeats),
           json_out)


def rehearse_command(protocol: Path, upstream: Path, gpus: int, home: Path | None, lock_timeout: float | None,
                     compile_cache: Path | None, calibrate_repeats: int | None = None) -> dict[str, Any]:
    """`orch rehearse`: the run id on stdout (stderr with --json), then the launch document and the judge (with
    --calibrate: the last A/A launch's, and the calibration)."""
    from orchestrator.run.launch import RunFailedError, RunInterruptedError
    from orchestrator.run.progress import plain_say
    from orchestrator.run.rehearse import rehearse as rehearse_run

    try:
        result = rehearse_run(protocol, upstream, gpus, home, say=plain_say, lock_timeout=lock_timeout,
                              compile_cache=compile_cache, calibrate_repeats=calibrate_repeats)
    except (RunFailedError, RunInterruptedError) as err:
        typer.echo(err.result.run_id)
        err.document = err.result.as_json()
        raise
    if result.launch is None:
        raise FailedError("rehearsal ended without a launch; see the messages above")
    typer.echo(result.launch.run_id)
    doc = {**result.launch.as_json(), "rehearsal": str(result.work.name), "judge": result.judge}
    if result.calibration is not None:
        doc["calibration"] = result.calibration.model_dump(mode="json", by_alias=True)
    return doc


@app.command(
    cls=OrchCommand,
    epilog=examples("orch calibrate protocol/r3_mini.yaml",
                    "orch calibrate protocol/r3_mini.yaml --repeats 8",
                    "orch calibrate protocol/r3_mini_cuda1.yaml --json | python -m json.tool"),
)
def calibrate(
    protocol: Annotated[Path, typer.Argument(help="protocol.yaml whose workload to calibrate", show_default=False)],
    repeats: Annotated[
        int | None, typer.Option("--repeats", min=1, max=32, help="A/A launches of one triplet, at least 2 (default 5)")
    ] = None,
    home: HomeOpt = None,
    json_out: JsonOpt = False,
    lock_timeout: LockTimeoutOpt = None,
    lock_dir: Annotated[Path | None, typer.Option("--lock-dir", help="host-wide lock directory of gpu-run")] = None,
) -> None:
    """A/A run (candidate = baseline): this host's spread between triplets for the workload, recorded in the ledger;
    later audits of the protocol on this host pool it, so one triplet gets a bounded interval."""
    report(lambda: calibrate_command(protocol, repeats, home, lock_timeout, lock_dir), json_out)


def calibrate_command(protocol: Path, repeats: int | None, home: Path | None, lock_timeout: float | None,
                      lock_dir: Path | None) -> dict[str, Any]:
    """`orch calibrate`: the run id on stdout (stderr with --json), then the launch and calibration documents."""
    from orchestrator.run.calibrate import calibrate as calibrate_run
    from orchestrator.run.launch import RunFailedError, RunInterruptedError
    from orchestrator.run.progress import plain_say

    try:
        result, cal = calibrate_run(protocol, repeats, home, say=plain_say, lock_timeout=lock_timeout,
                                    lock_dir=lock_dir)
    except (RunFailedError, RunInterruptedError) as err:
        typer.echo(err.result.run_id)
        err.document = err.result.as_json()
        raise
    typer.echo(result.run_id)
    return {**result.as_json(), "calibration": cal.model_dump(mode="json", by_alias=True)}


def launch_command(protocol: Path, home: Path | None, lock_timeout: float | None,
                   lock_dir: Path | None, until_decided: int | None = None) -> dict[str, Any]:
    """`orch launch`: the run id on stdout (stderr with --json); the verdict decides the exit code."""
    from orchestrator.run.launch import RunFailedError, RunInterruptedError
    from orchestrator.run.launch import launch as launch_run
    from orchestrator.run.progress import plain_say

    try:
        result = launch_run(protocol, home, say=plain_say, lock_timeout=lock_timeout, lock_dir=lock_dir,
                            until_decided=until_decided)
    except (RunFailedError, RunInterruptedError) as err:
        typer.echo(err.result.run_id)
        err.document = err.result.as_json()
        raise
    from ledger.verdict.decide.decision import exit_code

    typer.echo(result.run_id)
    doc = result.as_json()
    verdict = str(doc.get("verdict"))
    if exit_code(verdict) != 0:
        reasons = (result.audit or {}).get("reasons") or [verdict]
        raise FailedError(f"run {result.run_id}: audit verdict {verdict}: {reasons[0]}", document=doc)
    return doc


if __name__ == "__main__":  # pragma: no cover
    main()
