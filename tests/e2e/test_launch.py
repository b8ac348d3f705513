"""`orch launch` end to end on r3-mini (2 CPU ranks): real torchrun, real locks, real ledger, real faults.

Each test runs the real CLI in a subprocess on a copy of the project, so that it may edit the working tree.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pyarrow.ipc as ipc
import pytest
import yaml

from ledger.cost.store import Ledger
from ledger.verdict.decision import exit_code as verdict_exit_code
from orchestrator import gpu_lock

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ["checks", "train-A", "reload-A", "train-C", "reload-C", "train-B", "reload-B", "watch-C", "score"]
pytestmark = pytest.mark.slow


def make_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(REPO / "examples" / "r3_mini", proj / "examples" / "r3_mini",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "protocol").mkdir()
    (proj / "manifests").mkdir()
    shutil.copy(REPO / "protocol" / "r3_mini.yaml", proj / "protocol" / "r3_mini.yaml")
    shutil.copy(REPO / "manifests" / "r3_mini.json", proj / "manifests" / "r3_mini.json")
    return proj


def edit_protocol(proj: Path, change: Callable[[dict], None], name: str = "p.yaml") -> Path:  # type: ignore[type-arg]
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    change(data)
    path = proj / "protocol" / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def orch(*args: str, cwd: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def launch_cmd(proj: Path, protocol: Path, home: Path) -> list[str]:
    return orch("launch", str(protocol), "--home", str(home), "--json", "--lock-dir", str(home.parent / "locks"),
                cwd=proj)


def start(proj: Path, protocol: Path, home: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(launch_cmd(proj, protocol, home), cwd=proj, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def start_until(proj: Path, home: Path, package: str) -> tuple[subprocess.Popen[str], Path]:
    """Launch the shipped protocol and return once `package` has completed one step."""
    proc = start(proj, proj / "protocol" / "r3_mini.yaml", home)
    wait_for(lambda: (home / "runs").is_dir() and any((home / "runs").iterdir()), 60, "the run directory")
    run_dir = only_run(home)
    wait_for(lambda: steps_done(run_dir, package) >= 1, 240, f"{package} to run")
    return proc, run_dir


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def only_run(home: Path) -> Path:
    runs = sorted((home / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def steps_done(run_dir: Path, package: str) -> int:
    path = run_dir / "packages" / package / "steps.rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def records(home: Path) -> list[dict]:  # type: ignore[type-arg]
    with ipc.open_stream(str(home / "ledger" / "ledger.arrows")) as reader:
        return reader.read_all().to_pylist()  # type: ignore[no-any-return]


def run_processes(run_id: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("ORCH_RUN_ID") == run_id:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def lock_is_free(lock_dir: Path) -> bool:
    try:
        grant = gpu_lock.acquire(gpus=2, timeout=0, lock_dir=lock_dir, probe=_NoGpu())
    except gpu_lock.GpuLockTimeout:
        return False
    grant.release()
    return True


class _NoGpu:
    def count(self) -> int:
        return 0

    def foreign_users(self, index: int) -> list[tuple[int, int]]:
        return []


def test_complete_run_is_sealed_against_working_tree_edits_and_audited(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-C")
    # an edit of the working tree while train-C runs must not reach the run
    edited = proj / "examples" / "r3_mini" / "train" / "train_utils.py"
    edited.write_text(edited.read_text() + "\nEDITED_DURING_RUN = True\n")
    out, err = proc.communicate(timeout=400)
    summary = json.loads(out)  # with --json stdout is exactly one JSON document
    # the exit code is the verdict's, the same as `orch audit` gives (0 only when accepted)
    assert proc.returncode == verdict_exit_code(summary["verdict"]), err[-3000:]
    assert summary["status"] == "complete" and set(summary["packages"].values()) == {"ok"}
    assert "EDITED_DURING_RUN" not in (run_dir / "sealed" / "candidate" / "train" / "train_utils.py").read_text()
    # one open and one close record for each of the 9 packages, and an audit record
    recs = [r for r in records(home) if r["run_id"] == run_dir.name]
    for name in PACKAGES:
        statuses = [r["status"] for r in recs if r["package"] == name]
        assert statuses == ["open", "ok"], (name, statuses)
    assert any(r["kind"] == "audit" for r in recs)
    ledger = Ledger(home / "ledger" / "ledger.arrows")
    assert ledger.verify().ok
    # orch's own witness of the head, outside the ledger file: after the launch's records and after the audit's
    witnessed = [json.loads(line) for line in (home / "witness" / "heads.jsonl").read_text().splitlines()]
    assert [w["by"] for w in witnessed] == [f"launch {run_dir.name}", f"audit {run_dir.name}"]
    assert witnessed[-1]["size"] == ledger.head().size and witnessed[-1]["root"] == ledger.head().root
    audit = json.loads((run_dir / "audit.json").read_text())
    assert audit["exactness"]["exact"] is True
    assert audit["attribution"]["commitment_roots"]["candidate"] == json.loads(
        (REPO / "manifests" / "r3_mini.json").read_text())["root"]
    # checkpoints never reach evidence; the DEV score is sealed, never printed
    assert not (home / "scratch" / run_dir.name).exists()
    assert "dev_mean_reward" not in out + err
    assert oct((run_dir / "score.sealed.json").stat().st_mode & 0o777) == "0o400"
    # `orch audit` shows the recorded verdict and only then the DEV score, as information
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), "--json", cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=120)
    doc = json.loads(shown.stdout)
    assert doc["written"] is False and doc["audit"]["verdict"] == audit["verdict"]
    assert shown.returncode == proc.returncode
    assert doc["dev_score"]["informational"] is True and doc["dev_score"]["verified"] is True


def test_failing_package_stops_the_run_and_leaves_no_audit(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    protocol = edit_protocol(proj, lambda d: d["arms"]["candidate"].update(config={"no_such_flag": "1"}))
    proc = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "package train-C failed" in proc.stderr
    run_dir = only_run(home)
    recs = [r for r in records(home) if r["run_id"] == run_dir.name]
    closes = {r["package"]: r["status"] for r in recs if r["status"] != "open"}
    assert closes == {"checks": "ok", "train-A": "ok", "reload-A": "ok", "train-C": "failed", "reload-C": "not-run",
                      "train-B": "not-run", "reload-B": "not-run", "watch-C": "not-run", "score": "not-run"}
    assert not (run_dir / "audit.json").exists()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    # orch audit of that run writes nothing and shows no score
    shown = subprocess.run(orch("audit", run_dir.name, "--home", str(home), cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 1 and "missing or failed: package train-C: failed (exit " in shown.stdout + shown.stderr
    assert not (run_dir / "audit.json").exists() and "dev_mean_reward" not in shown.stdout + shown.stderr


def test_write_into_the_sealed_copy_fails_the_run_naming_the_path(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-A")
    target = run_dir / "sealed" / "baseline" / "train" / "reward_func.py"
    target.chmod(0o644)
    with open(target, "a") as f:
        f.write("\n# forced write\n")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1
    assert "train/reward_func.py" in err and "sealed copy of baseline was modified" in err
    recs = [r for r in records(home) if r["run_id"] == run_dir.name and r["status"] != "open"]
    assert {r["package"]: r["status"] for r in recs}["train-A"] == "failed"
    assert all(r["status"] == "not-run" for r in recs if r["package"] not in ("checks", "train-A"))
    assert not (run_dir / "audit.json").exists()


def test_kill_9_of_orch_leaves_no_process_and_frees_the_lock(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-A")
    assert len(run_processes(run_dir.name)) >= 3  # worker, torchrun, ranks
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not run_processes(run_dir.name), 5, "every process of the run to end")
    assert lock_is_free(home.parent / "locks")
    # the next ledger verify reports the orphaned run
    shown = subprocess.run(orch("ledger", "verify", "--home", str(home), cwd=proj), cwd=proj, env=env(),
                           capture_output=True, text=True, timeout=60)
    assert (f"orphaned: run {run_dir.name} package train-A was opened and never closed (crash or kill)"
            in shown.stdout + shown.stderr)


def test_ctrl_c_records_interrupted_and_exits_130(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    proc, run_dir = start_until(proj, home, "train-A")
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130
    wait_for(lambda: not run_processes(run_dir.name), 5, "every process of the run to end")
    assert lock_is_free(home.parent / "locks")
    closes = {r["package"]: r["status"] for r in records(home) if r["run_id"] == run_dir.name and r["status"] != "open"}
    assert closes["train-A"] == "interrupted"
    assert [closes[p] for p in PACKAGES[2:]] == ["not-run"] * 7
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


def test_refused_protocol_costs_no_gpu_time(tmp_path: Path) -> None:
    proj = make_project(tmp_path)
    home = tmp_path / "home"
    protocol = edit_protocol(proj, lambda d: d["recipe"].update(lr=1.0e-5))
    proc = subprocess.run(launch_cmd(proj, protocol, home), cwd=proj, env=env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 3 and "recipe.lr = 1e-05 (upstream 5e-06)" in proc.stderr
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())
    # and sources that differ from the commitment are refused with the diff, before the lock
    (proj / "examples" / "r3_mini" / "train" / "train_utils.py").write_text("# changed\n")
    proc = subprocess.run(launch_cmd(proj, proj / "protocol" / "r3_mini.yaml", home), cwd=proj, env=env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3 and "1 changed (train/train_utils.py)" in proc.stderr
