"""The CLI as a new user meets it: version, help with examples, pure JSON on stdout, options where users put them,
tables that keep every key and figure, verify that finds its root, pre-flight refusals before any record."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cliutil import orch as orch_in_process
from rich.console import Console

from ledger.cost.store import Ledger
from ledger.render import print_whole, whole_table
from protocol.audit_doc import AuditDocument, EvidenceDocument
from protocol.gpu_record import GpuRunRecord

REPO = Path(__file__).resolve().parents[2]
LONG_RUN = "20261201T121500Z-3844cbb9-ab12"


def orch(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", *args], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80", **(env or {})},
                          timeout=120)


def orch_here(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """orch() in this process (tests/cliutil.py): same entry point and environment, no new interpreter per call."""
    return orch_in_process(*args, cwd=cwd, env={**os.environ, "COLUMNS": "80"})


def _home(tmp_path: Path, runs: int = 3) -> Path:
    home = tmp_path / "X"
    ledger = Ledger(home / "ledger" / "ledger.arrows", fsync=False)
    for r in range(runs):
        for kind in ("checks", "train", "score"):
            ledger.append(run_id=f"{LONG_RUN}{r}", package=kind, kind=kind, status="ok", gpus=8,
                          started="2026-12-01T12:15:00Z", ended="2026-12-01T12:35:00.125Z", wall_s=1200.125,
                          gpu_seconds=9601.0, lock_wait_s=13.5, protocol_id="p" * 64)
    return home


def test_version_and_short_help(tmp_path: Path) -> None:
    from importlib.metadata import version

    proc = orch("--version", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.strip() == f"orch {version('orch')}"
    assert orch("-h", cwd=tmp_path).returncode == 0


@pytest.mark.parametrize("command", [
    ["freeze"], ["verify"], ["schema"], ["audit"], ["publish"], ["hygiene"], ["launch"], ["calibrate"], ["rehearse"],
    ["ledger"],
    ["ledger", "summary"], ["ledger", "list"], ["ledger", "export"], ["ledger", "verify"], ["ledger", "head"],
    ["ledger", "repair"], ["ledger", "reconcile"],
])
def test_every_help_has_examples_and_plain_usage(command: list[str], tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.orch import app

    res = CliRunner().invoke(app, [*command, "-h"], env={"COLUMNS": "100"})
    assert res.exit_code == 0, res.output
    assert "Examples:" in res.output and "$ orch " in res.output
    assert "{" not in res.output.split("\n\n")[0] + res.output.splitlines()[1]  # usage reads RUN_ID, not {RUN_ID}
    if command == ["audit"]:
        assert "Usage: orch audit [OPTIONS] RUN_ID" in res.output


def test_completion_is_offered(tmp_path: Path) -> None:
    # typer finds the user's shell among orch's parent processes (shellingham), not in $SHELL: started from bash, as
    # a user's shell would start it (a bare subprocess of a pytest that nothing but init parents finds no shell)
    cmd = " ".join([sys.executable, "-m", "orchestrator.cli.orch", "--show-completion"])
    proc = subprocess.run(["bash", "-c", f"{cmd}; exit $?"], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "SHELL": "/bin/sh"}, timeout=120)
    # the registration line of the bash script itself: the bare word "complete" also occurs in its body
    assert proc.returncode == 0 and "\ncomplete -o default -F _orch_completion orch\n" in proc.stdout


def test_group_options_apply_to_the_subcommand_and_nothing_is_created(tmp_path: Path) -> None:
    home = _home(tmp_path)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    proc = orch("ledger", "--home", str(home), "verify", cwd=cwd)
    assert proc.returncode == 0 and "ok: 9 records" in proc.stdout and str(home) in proc.stdout
    head = orch("ledger", "--home", str(home), "--json", "head", cwd=cwd)
    assert json.loads(head.stdout)["size"] == 9
    assert not (cwd / ".orch").exists()  # read-only commands never create a home
    wrong = orch("ledger", "--home", str(home), "--by", "run", "head", cwd=cwd)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == "orch: --by does not apply to `orch ledger head`; see `orch ledger head -h`"
    ignored_before = orch("ledger", "--format", "json", "verify", "--home", str(home), cwd=cwd)
    assert ignored_before.returncode == 2 and "--format does not apply" in ignored_before.stderr
    missing = orch("ledger", "--home", str(tmp_path / "nothing"), "verify", cwd=cwd)
    assert missing.returncode == 1 and "no ledger at" in missing.stderr
    assert not (tmp_path / "nothing").exists() and not (cwd / ".orch").exists()


def test_ledger_into_a_file_keeps_whole_ids_and_figures(tmp_path: Path) -> None:
    home = _home(tmp_path)
    with open(tmp_path / "f.txt", "w") as out:
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", "ledger", "--by", "run", "--home",
                               str(home)], stdout=out, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "f.txt").read_text()
    for r in range(3):
        assert f"{LONG_RUN}{r}" in text
    assert "28,803.0" in text and "…" not in text and "total" in text


def test_tables_keep_every_cell_in_an_80_column_terminal() -> None:
    header = ["run", "runs", "packages", "ok", "failed", "not run", "open", "gpu seconds", "wall s", "lock wait s",
              "GPU-h"]
    row = [LONG_RUN, "1", "8", "8", "0", "0", "0", "1,234,567.5", "1,234.5", "13.5", "342.94"]
    out = io.StringIO()
    print_whole(whole_table(header, [row]), Console(file=out, width=80, force_terminal=True, no_color=True))
    text = out.getvalue()
    assert "…" not in text and all(cell in text for cell in row)


def test_audit_json_is_one_document_and_launch_exit_follows_the_verdict(tmp_path: Path) -> None:
    from test_audit import TENSORS, RunSpec, make_run

    drift = RunSpec()
    drift.durations["B"] = [0.2] * 12 + [0.3] * 4  # one triplet recorded before any calibration: not bounded
    make_run(tmp_path, "run3", drift)
    make_run(tmp_path, "run1", RunSpec(calibrated=True))  # one triplet, bounded by the host's A/A calibration
    make_run(tmp_path, "run2", RunSpec(diverge=("C", 3, 0, TENSORS[0])))  # the candidate's bits differ: not exact
    ok = orch_here("audit", "run1", "--home", str(tmp_path), "--json", cwd=tmp_path)
    tool = subprocess.run([sys.executable, "-m", "json.tool"], input=ok.stdout, capture_output=True, text=True)
    assert ok.returncode == 0 and tool.returncode == 0
    doc = json.loads(ok.stdout)
    AuditDocument.model_validate(doc["audit"])  # the published schema describes what is written
    assert "verdict: accepted" in ok.stderr and "SUM" in doc["units"]["speedup.windows[].A|C|B"]
    bad_run = orch_here("audit", "run2", "--home", str(tmp_path), "--json", cwd=tmp_path)
    bad = json.loads(bad_run.stdout)
    assert bad_run.returncode == 1 and bad["exit_code"] == 1 and bad["audit"]["verdict"] == "not exact"
    same = orch_here("audit", "run3", "--home", str(tmp_path), "--json", cwd=tmp_path)
    assert same.returncode == 0 and json.loads(same.stdout)["audit"]["verdict"] == "no difference shown"
    statuses = {r.run_id: r.status for r in Ledger(tmp_path / "ledger" / "ledger.arrows").records()
                if r.kind == "audit"}
    # the audit package's status is the verdict, never `failed`
    assert statuses == {"run1": "accepted", "run2": "not exact", "run3": "no difference shown"}
    none = orch_here("audit", "run9", "--home", str(tmp_path), "--json", cwd=tmp_path)
    assert none.returncode == 2 and json.loads(none.stdout)["exit_code"] == 2  # no such run: one document too
    mixed = orch_here("audit", "run1", "run2", "--home", str(tmp_path), cwd=tmp_path)
    assert mixed.returncode == 2 and "never multiplied or mixed" in mixed.stderr
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "docs" / "validation").mkdir(parents=True)
    published = orch_here("publish", "run1", "--to", "docs/validation/e.json", "--home", str(tmp_path), "--json",
                     cwd=repo)
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["run_id"] == "run1"
    EvidenceDocument.model_validate(json.loads((repo / "docs" / "validation" / "e.json").read_text()))


@pytest.mark.parametrize("kind", ["protocol", "recipe", "audit", "calibration", "evidence", "gpu-run", "ledger-record"])
def test_schema_kinds_print_json_schemas(kind: str, tmp_path: Path) -> None:
    proc = orch("schema", "--kind", kind, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "properties" in json.loads(proc.stdout)
    assert orch("schema", "--kind", "nope", cwd=tmp_path).returncode == 2


def test_gpu_run_record_matches_its_schema(tmp_path: Path) -> None:
    rec = tmp_path / "rec.json"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.gpu_run", "--lock-dir", str(tmp_path / "locks"),
                           "--record", str(rec), "--", "true"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO), "GPU_RUN_FAKE_NVML": _no_gpus(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    GpuRunRecord.model_validate_json(rec.read_text())


def _no_gpus(tmp_path: Path) -> str:
    path = tmp_path / "gpu_query.json"
    path.write_text('{"devices": []}')
    return str(path)


def test_verify_finds_the_recorded_root_or_asks_for_one(tmp_path: Path) -> None:
    proc = orch("verify", "manifests/r3_mini.json", "--json", cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["ok"] is True
    plain = json.loads((REPO / "manifests" / "r3_mini.json").read_text())
    plain.pop("sources_root")
    (tmp_path / "m.json").write_text(json.dumps(plain))
    asked = orch("verify", str(tmp_path / "m.json"), cwd=tmp_path)
    assert asked.returncode == 3 and "pass --root DIR" in asked.stderr
    assert len(asked.stderr.strip().splitlines()) == 1


def test_freeze_takes_several_globs_after_one_include_and_records_its_root(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    src = repo / "src"
    (src / "train").mkdir(parents=True)
    (src / "modeling").mkdir()
    (src / "train" / "a.py").write_text("a = 1\n")
    (src / "modeling" / "b.py").write_text("b = 2\n")
    out = repo / "manifests" / "m.json"
    out.parent.mkdir()
    proc = orch("freeze", str(src), "--include", "train/*.py", "modeling/*.py", "-o", str(out), "--json", cwd=repo)
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    assert doc["files"] == 2 and doc["sources_root"] == "src"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert orch("verify", str(out), cwd=elsewhere).returncode == 0  # the recorded root is found from anywhere
    (src / "train" / "a.py").write_text("a = 2\n")
    changed = orch("verify", str(out), "--json", cwd=elsewhere)
    assert changed.returncode == 3 and json.loads(changed.stdout)["changed"] == ["train/a.py"]


def test_hygiene_json(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("nothing here\n")
    (tmp_path / "bad.txt").write_text("path " + "/ho" + "me/alice/x\n")  # split: this file stays clean
    proc = orch("hygiene", str(tmp_path), "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["ok"] is False and doc["findings"][0]["path"].endswith("bad.txt")


def test_launch_refuses_missing_worker_packages_before_any_record(tmp_path: Path) -> None:
    block = tmp_path / "block"
    block.mkdir()
    # this interpreter then finds no safetensors: what a machine without the workers extra looks like
    (block / "sitecustomize.py").write_text(
        "import sys\n"
        "class _Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('safetensors', 'torch'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.orch", "launch",
                           str(REPO / "protocol" / "r3_mini.yaml"), "--home", str(home), "--json"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": f"{block}{os.pathsep}{REPO}"})
    assert proc.returncode == 3, proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "torch, safetensors" in line and "pip install" in line
    assert json.loads(proc.stdout)["exit_code"] == 3
    assert not home.exists()  # no lock, no run directory, no ledger record


def test_launch_json_refusal_is_one_document(tmp_path: Path) -> None:
    bad = tmp_path / "protocol" / "p.yaml"
    bad.parent.mkdir()
    text = (REPO / "protocol" / "r3_mini.yaml").read_text().replace("lr: 5.0e-6", "lr: 1.0e-5")
    bad.write_text(text)
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    shutil.copytree(REPO / "recipes", tmp_path / "recipes")  # the recipe file it names, under its base
    proc = orch("launch", str(bad), "--home", str(tmp_path / "h"), "--json", cwd=tmp_path)
    doc = json.loads(proc.stdout)
    assert proc.returncode == 3 and doc["exit_code"] == 3 and doc["ok"] is False
    assert "recipe.lr = 1e-05 (upstream 5e-06)" in doc["error"]


@pytest.mark.parametrize("command", ["launch", "calibrate"])
def test_negative_lock_timeout_is_one_usage_line_before_any_run(command: str, tmp_path: Path) -> None:
    # found by the attack battery: launch made a run folder, 9 not-run records and a scratch before refusing
    shutil.copytree(REPO / "manifests", tmp_path / "manifests")
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    proc = orch(command, str(REPO / "protocol" / "r3_mini.yaml"), "--home", str(home), "--lock-timeout", "-1",
                cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    out = (proc.stdout + proc.stderr).strip()
    assert out == (f"orch {command}: Invalid value for '--lock-timeout': Input should be greater than or equal to 0; "
                   f"see `orch {command} --help`"), out
    assert not home.exists()  # no run folder, no ledger record, no scratch


@pytest.mark.parametrize("args", [["launch", "p.yaml", "--lock-timeout", "-1"], ["audit"], ["ledger", "list", "-x"]])
def test_a_parser_refusal_with_json_is_one_document_on_stdout(args: list[str], tmp_path: Path) -> None:
    proc = orch(*args, "--json", cwd=tmp_path)
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)  # before: stdout was empty, only the line on stderr
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["error"] == proc.stderr.strip()


def test_gpu_run_refuses_a_missing_command_at_once_even_when_busy(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPU_RUN_FAKE_NVML": _no_gpus(tmp_path),
           "GPU_RUN_LOCK_DIR": str(tmp_path / "locks"), "GPU_RUN_SLOTS": "1"}
    holder = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.gpu_run", "--", "sleep", "30"], env=env,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not any((tmp_path / "locks").glob("slot0.lock")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # the only slot is held now
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "orchestrator.cli.gpu_run", "--timeout", "30", "--",
                               str(tmp_path / "nonexistent")], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 127 and "command not found" in proc.stderr
        assert time.monotonic() - t0 < 15  # refused before waiting for the held slot (30 s)
        assert "waiting" not in proc.stderr and "busy" not in proc.stderr
    finally:
        holder.kill()
        holder.wait()
    usage = subprocess.run([sys.executable, "-m", "orchestrator.cli.gpu_run", "-h"], env=env, capture_output=True,
                           text=True, timeout=60)
    assert usage.returncode == 0 and "Examples:" in usage.stdout and "-- CMD..." in usage.stdout
    both = subprocess.run([sys.executable, "-m", "orchestrator.cli.gpu_run", "--gpus", "1", "--devices", "0", "--",
                           "true"], env=env, capture_output=True, text=True, timeout=60)
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1


def test_every_declared_dependency_is_used() -> None:
    """A dependency nothing imports is weight for every install (filelock was one: the locks are flock(2))."""
    import re
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    imports = {"pyyaml": "yaml", "nvidia-ml-py": "py" + "NVML".lower()}
    sources = "\n".join(p.read_text() for d in ("protocol", "manifests", "orchestrator", "ledger")
                        for p in (REPO / d).rglob("*.py"))
    for dep in deps:
        name = re.split(r"[<>=;\[ ]", dep)[0].lower()
        module = imports.get(name, name.replace("-", "_"))
        if name == "nvidia-ml-py":  # imported by name, when a GPU is first probed (protocol/host/gpu_library.py)
            from protocol.host import gpu_library

            assert gpu_library._LIB == module and "importlib.import_module(_LIB)" in sources
            continue
        assert re.search(rf"^\s*(import|from) {module}\b", sources, re.M), f"{name} is declared but never imported"
