"""`orch freeze`, `orch verify` and `orch schema` through the real CLI: every documented exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from orchestrator.cli.orch import app

runner = CliRunner()


def _tree(root: Path) -> Path:
    (root / "train").mkdir(parents=True)
    (root / "modeling").mkdir()
    (root / "train" / "loss.py").write_text("def loss():\n    return 1\n")
    (root / "modeling" / "model.py").write_text("class M: ...\n")
    return root


def test_freeze_then_verify_equal_exits_0(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    out = tmp_path / "m.json"
    r = runner.invoke(app, ["freeze", str(src), "-i", "train/**/*.py", "-i", "modeling/**/*.py", "-o", str(out)])
    assert r.exit_code == 0, r.output
    manifest = json.loads(out.read_text())
    assert manifest["schema"] == "orch.manifest/1"
    assert [e["path"] for e in manifest["entries"]] == ["modeling/model.py", "train/loss.py"]
    r = runner.invoke(app, ["verify", str(out), "--root", str(src)])
    assert r.exit_code == 0 and manifest["root"] in r.output


def test_verify_mismatch_exits_3_with_the_diff(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    out = tmp_path / "m.json"
    runner.invoke(app, ["freeze", str(src), "-i", "**/*.py", "-o", str(out)])
    (src / "train" / "loss.py").write_text("def loss():\n    return 2\n")
    (src / "train" / "extra.py").write_text("")
    (src / "modeling" / "model.py").unlink()
    (src / "modeling" / "other.py").write_text("")
    r = runner.invoke(app, ["verify", str(out), "--root", str(src)])
    assert r.exit_code == 3
    assert "changed  train/loss.py" in r.output
    assert "added    train/extra.py" in r.output
    assert "removed  modeling/model.py" in r.output


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert runner.invoke(app, ["freeze"]).exit_code == 2
    assert runner.invoke(app, ["freeze", str(tmp_path), "-i", "*.py", "--format", "xml"]).exit_code == 2
    assert runner.invoke(app, ["verify"]).exit_code == 2


def test_missing_commitment_exits_3(tmp_path: Path) -> None:
    r = runner.invoke(app, ["verify", str(tmp_path / "nope.json"), "--root", str(tmp_path)])
    assert r.exit_code == 3 and "run `orch freeze` first" in r.output


def test_sha256sum_export_is_accepted_by_sha256sum(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src")
    out = tmp_path / "sums.txt"
    r = runner.invoke(app, ["freeze", str(src), "-i", "**/*.py", "--format", "sha256sum", "-o", str(out)])
    assert r.exit_code == 0
    check = subprocess.run(["sha256sum", "-c", str(out)], cwd=src, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2


def test_schema_prints_the_json_schema() -> None:
    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0
    schema = json.loads(r.output)
    assert "recipe" in schema["properties"] and "precision" in schema["properties"]


def test_console_script_runs_without_torch(repo: Path) -> None:
    """The CPU side imports no torch: importing the whole CLI must not load it."""
    code = "import sys, orchestrator.cli.orch; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=repo, check=True)


def _real(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


def test_usage_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    cases = {
        ("audit",): "orch audit: Missing argument 'RUN_ID'; see `orch audit --help`",
        ("launch", "p.yaml", "--lock-timeout", "soon"): "orch launch: Invalid value for '--lock-timeout'",
        ("nosuch",): "orch: No such command 'nosuch'",
        ("ledger", "verify", "--bogus"): "orch ledger verify: No such option: --bogus",
    }
    for args, start in cases.items():
        proc = _real(*args, cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith(start), proc.stderr


def test_an_os_error_is_one_line_with_exit_1(tmp_path: Path) -> None:
    out_dir = tmp_path / "ro"
    out_dir.mkdir()
    src = _tree(tmp_path / "src")
    out_dir.chmod(0o500)
    try:  # root ignores directory permissions: a path through a regular file fails for everyone
        blocked = (tmp_path / "src" / "train" / "loss.py" / "m.json") if os.geteuid() == 0 else out_dir / "m.json"
        proc = _real("freeze", str(src), "-i", "**/*.py", "-o", str(blocked), cwd=tmp_path)
    finally:
        out_dir.chmod(0o700)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
