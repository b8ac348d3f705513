"""The commands the user documentation shows are real: each `orch` / `gpu-run` line in a code block of README.md,
docs/GUIDE.md and docs/TRL_GRPO.md parses against the real command tree (its subcommand and every option exist and
take such values), and each subcommand the guide uses is run by a test (tests/e2e, or tests/unit through the real
CLI)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer

from orchestrator.cli.gpu_run import app as gpu_run_app
from orchestrator.cli.orch import app

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", REPO / "docs" / "GUIDE.md", REPO / "docs" / "TRL_GRPO.md"]
FENCE = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
# placeholders a reader replaces; each stands for a value the option or argument accepts
PLACEHOLDERS = {"RUN_ID": "20260101T000000Z-0123abcd-0001", "NAME": "my_run"}


def documented_commands() -> list[tuple[str, list[str]]]:
    """(file:line, argv) of every command line that starts with orch or gpu-run in a fenced block."""
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            start = text[: block.start()].count("\n") + 2
            for i, raw in enumerate(block.group(1).splitlines()):
                line = raw.split(" #", 1)[0].strip()
                line = re.sub(r"^(\.venv/bin/|\$ )", "", line)
                if not re.match(r"(orch|gpu-run)( |$)", line):
                    continue
                argv = shlex.split(line.split(" | ", 1)[0].split(" > ", 1)[0])
                argv = [PLACEHOLDERS.get(a, a) for a in argv]
                out.append((f"{doc.relative_to(REPO)}:{start + i}", argv))
    return out


def _leftover(ctx: Any) -> list[str]:
    """The arguments a group left for its subcommand (click < 8.2: protected_args; later and typer's own click:
    _protected_args)."""
    protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
    return [*protected, *ctx.args]


def _parse(command: Any, args: list[str], name: str) -> list[str]:
    """Parse args down the command tree as the CLI would, without running anything; returns the subcommand path.
    A usage error raises (click's or typer's own ClickException); --help and --version raise typer.Exit."""
    ctx = command.make_context(name, list(args), resilient_parsing=False)
    path = [name]
    while hasattr(command, "resolve_command") and _leftover(ctx):
        sub_name, sub, sub_args = command.resolve_command(ctx, _leftover(ctx))
        assert sub is not None and sub_name is not None
        path.append(sub_name)
        ctx = sub.make_context(sub_name, sub_args, parent=ctx, resilient_parsing=False)
        command = sub
    return path


def _parses(root: Any, argv: list[str]) -> str | None:
    """None when argv parses (or stops at --help / --version), else the CLI's one-line usage error."""
    try:
        _parse(root, argv[1:], argv[0])
    except typer.Exit:
        return None
    except Exception as err:  # the usage errors of whichever click typer runs on
        if hasattr(err, "format_message"):
            return str(err.format_message())
        raise
    return None


COMMANDS = documented_commands()


def test_the_guide_shows_the_main_commands() -> None:
    shown = {" ".join(argv[:2]) for _, argv in COMMANDS}
    for needed in ("orch freeze", "orch calibrate", "orch launch", "orch audit", "orch publish"):
        assert needed in shown, f"{needed} is not shown in README.md or docs/GUIDE.md"


def _root(argv: list[str]) -> Any:
    return typer.main.get_command(app if argv[0] == "orch" else gpu_run_app)


def test_the_parser_refuses_what_the_cli_refuses() -> None:
    for bad in (["orch", "launch", "protocol/r3_mini.yaml", "--no-such-option"], ["orch", "no-such-command"],
                ["orch", "calibrate", "protocol/r3_mini.yaml", "--repeats", "many"], ["orch", "publish", "RUN"],
                ["orch", "ledger", "no-such-subcommand"], ["gpu-run", "--gpus", "two", "--", "true"]):
        assert _parses(_root(bad), bad), f"`{' '.join(bad)}` parsed, but the CLI refuses it"
    assert _parses(_root(["orch", "launch", "--help"]), ["orch", "launch", "--help"]) is None


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_each_documented_command_parses(where: str, argv: list[str]) -> None:
    if argv[0] == "gpu-run" and "--" in argv:
        argv = argv[: argv.index("--") + 2]
    error = _parses(_root(argv), argv)
    assert error is None, f"{where}: `{' '.join(argv)}` does not parse: {error}"


def _runs(sub: str) -> re.Pattern[str]:
    """A test that runs `orch SUB`: SUB first in a list literal (an argv: runner.invoke(app, ["SUB", ...]),
    orch_argv(...) lists) or first argument of the tests' orch(...) / orch_argv(...) helpers; dict look-ups such as
    doc["SUB"] do not count."""
    quoted = rf"[\"']{re.escape(sub)}[\"']"
    return re.compile(rf"(?<![\w\])])\[\s*{quoted}|\borch(?:_argv)?\(\s*{quoted}")


def test_each_guide_subcommand_is_run_by_a_test() -> None:
    tests = "\n".join(p.read_text() for p in (REPO / "tests").glob("*/test_*.py") if p.name != "test_guide.py")
    for where, argv in COMMANDS:
        if argv[0] != "orch" or len(argv) < 2 or argv[1].startswith("-"):
            continue
        assert _runs(argv[1]).search(tests), f"{where}: no test runs `orch {argv[1]}`"
    assert not _runs("schema").search('doc["schema"] == x; d.get("schema")')


def test_the_readme_states_the_limits_the_attack_battery_reads() -> None:
    """bench/attack (make attack) reads these sentences in README.md: a documented limit must stay documented."""
    readme = " ".join((REPO / "README.md").read_text().split())
    assert "a candidate that detects the watch" in readme  # bench/attack/cheats.py
    assert "indistinguishable from an honest append" in readme  # bench/attack/tampers.py
