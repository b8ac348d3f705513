"""orchestrator/cli/common.py: errors become their exit code and one line; with --json one document on stdout."""

from __future__ import annotations

import errno
import io
import json

import pytest
import typer

from orchestrator.cli.common import guard, refuse_misplaced, report
from orchestrator.cli.entry import _asks_json
from protocol.errors import LockTimeoutError, RefusedError


def _exit_of(raised: BaseException, as_json: bool) -> tuple[int, str]:
    out = io.StringIO()
    with pytest.raises(typer.Exit) as ex, guard(as_json, out):
        raise raised
    return ex.value.exit_code, out.getvalue()


def test_each_error_is_its_exit_code_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert _exit_of(RefusedError("sources differ; run `orch freeze`"), False) == (3, "")
    assert capsys.readouterr().err == "orch: sources differ; run `orch freeze`\n"
    assert _exit_of(KeyboardInterrupt(), False) == (130, "")
    assert capsys.readouterr().err == "orch: interrupted\n"
    code, _ = _exit_of(OSError(errno.ENOSPC, "No space left on device", "/h/x"), False)
    assert code == 1
    assert capsys.readouterr().err == (
        "orch: No space left on device: /h/x; free disk space or fix permissions and retry\n")


def test_with_json_the_refusal_is_also_one_document_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _exit_of(LockTimeoutError("no GPU in 600 s", {"waited_s": 600}), True)
    assert code == 75
    assert json.loads(out) == {"ok": False, "exit_code": 75, "error": "no GPU in 600 s", "waited_s": 600}
    assert out.count("\n") == 1 and capsys.readouterr().err == "orch: no GPU in 600 s\n"


def test_a_report_prints_for_humans_on_stderr_and_its_document_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    def fn() -> dict[str, int]:
        print("a table for humans")
        return {"size": 3}

    report(fn, as_json=True)
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ('{"size": 3}\n', "a table for humans\n")
    report(fn, as_json=False)
    assert capsys.readouterr().out == "a table for humans\n"


def test_a_group_option_the_subcommand_does_not_take_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    refuse_misplaced("head", {"as_json": None, "by": None}, ("as_json",))
    with pytest.raises(typer.Exit) as ex:
        refuse_misplaced("head", {"fmt": "parquet", "by": "run", "as_json": True}, ("as_json",))
    assert ex.value.exit_code == 2
    assert capsys.readouterr().err == (
        "orch: --format, --by does not apply to `orch ledger head`; see `orch ledger head -h`\n")


def test_json_is_asked_of_orch_only_before_the_command_of_gpu_run() -> None:
    assert _asks_json(["audit", "r1", "--json"]) and not _asks_json(["--gpus", "1", "--", "tool", "--json"])
    assert _asks_json(["--json", "--", "tool"]) and not _asks_json(["audit", "r1"])
