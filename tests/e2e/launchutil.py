"""Helpers of the end-to-end tests: a project copy that a test may edit, the real `orch` CLI in a subprocess, the
protocol variants the tests launch, and what they read back (ledger records, the run's processes, the lock)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pyarrow.ipc as ipc
import yaml

from orchestrator.lock import gpu_lock
from orchestrator.run.housekeeping import STAGING_PREFIX

REPO = Path(__file__).resolve().parents[2]
EDITED = Path("examples") / "r3_mini" / "train" / "train_utils.py"  # edited while the complete run runs
PACKAGES = ["checks", "prime", "train-A", "reload-A", "train-C", "reload-C", "train-B", "reload-B", "watch-C", "score"]
# shorter rollouts (decode tokens, denoise steps) only: the model, its initial state and the recipe are unchanged
SMALL = ["--max_output_token_n_gen", "8", "--max_output_token_n_edit", "8",
         "--num_timesteps_gen", "4", "--num_timesteps_edit", "4"]
GIT = ["git", "-c", "user.name=orch-test", "-c", "user.email=orch-test@example.invalid", "-c", "commit.gpgsign=false"]


@dataclass(frozen=True)
class CompleteRun:
    """A finished `orch launch --json`: its project copy, home, run directory, exit code, stdout and stderr."""

    proj: Path
    home: Path
    run_dir: Path
    returncode: int
    out: str
    err: str


def small_protocol(data: dict[str, Any]) -> None:
    """The protocol with shorter rollouts: for every end-to-end launch."""
    data["launcher"]["args"] = [*data["launcher"]["args"], *SMALL]
    data["scorer"]["command"] = [*data["scorer"]["command"], *SMALL]


def prepare_only(data: dict[str, Any]) -> None:
    """Shorter rollouts and checks that only prepare the initial state (no diagnostic, no static graph): for the
    launches whose tests read no diagnostic. The complete run (conftest.py) keeps every check. r3-mini compiles
    nothing, so these launches declare it (measurement.compile: none): no prime package runs, and orch checks after
    every package that nothing was compiled; the complete run and the tuned-kernel tests keep the prime."""
    small_protocol(data)
    data["checks"]["diagnostics"] = []
    data["checks"]["static_graph"] = None
    data["measurement"]["compile"] = "none"


def quick_protocol(data: dict[str, Any]) -> None:
    """prepare_only and 12 steps, 2 of them warm-up, one timed window of 10 (steps 2-11), digests of steps 0-11: for
    the r3-mini launches whose tests read no timing window (the cheats). 12 steps is the fewest an audited r3-mini
    run can have (the probe must see the recipe's LR warm-up end at step 10); the short measurement warm-up keeps the
    watched steps of each timed launch to 0-1 (a watched step costs about twice a plain one), while the watched
    replay still watches all 12."""
    prepare_only(data)
    data["measurement"].update(steps=12, warmup=2, window=10, digest_last=11)


def one_rank(data: dict[str, Any]) -> None:
    """The protocol on one CPU rank: for the tests of orch's verdict bookkeeping, which read launches' step times and
    digests but nothing about how ranks agree. A package then starts two interpreters that import torch (torchrun
    and one rank) instead of three, and holds one core instead of two."""
    data["launcher"]["nproc"] = 1


MINIMAL = REPO / "tests" / "fixtures" / "minimal"  # the smallest trainer orch runs, its scorer, recipe and protocol
MINIMAL_PROTOCOL = "minimal.yaml"


def lay_out_minimal(proj: Path) -> None:
    """The minimal trainer's files in a new project folder: trainer/ (train.py, score.py) and recipes/minimal.yaml."""
    (proj / "trainer").mkdir(parents=True)
    for name in ("train.py", "score.py"):
        shutil.copy(MINIMAL / name, proj / "trainer" / name)
    (proj / "recipes").mkdir()
    shutil.copy(MINIMAL / "recipe.yaml", proj / "recipes" / "minimal.yaml")


def make_minimal_project(tmp_path: Path, commit: bool = True) -> Path:
    """A git project of the minimal trainer (tests/fixtures/minimal): trainer/ (train.py, score.py),
    recipes/minimal.yaml, protocol/minimal.yaml (2 CPU ranks, 16 steps, three windows of 4, compile: none) and the
    commitment both arms name, manifests/minimal.json, made by `orch freeze`; committed unless `commit` is false.

    For the tests about orch's own bookkeeping (verdicts, calibration, the sequential stop, the installed tool, a
    launch that is stopped or killed, one arm's compile cache): a package pays the interpreters' start-up and torch's
    import and little else (r3-mini's also pay its rollouts: about a third more CPU a launch). edit_protocol(proj,
    change, source=MINIMAL_PROTOCOL) makes the variants; MINI_STEP_S in launcher.env gives a test time to act while
    a package runs."""
    proj = tmp_path / "proj"
    lay_out_minimal(proj)
    (proj / "protocol").mkdir()
    shutil.copy(MINIMAL / "protocol.yaml", proj / "protocol" / MINIMAL_PROTOCOL)
    (proj / "manifests").mkdir()
    freeze(proj, proj / "protocol" / MINIMAL_PROTOCOL, "manifests/minimal.json")
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    if commit:
        subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
        subprocess.run([*GIT, "commit", "-q", "-m", "minimal trainer, recipe, protocol, commitment"], cwd=proj,
                       check=True)
    return proj


def freeze(proj: Path, protocol: Path, output: str, arm: str = "baseline") -> None:
    """`orch freeze --protocol PROTOCOL --arm ARM -o OUTPUT` in the project: the commitment of that arm's sources."""
    done = subprocess.run(orch("freeze", "--protocol", str(protocol), "--arm", arm, "-o", output, cwd=proj),
                          cwd=proj, env=env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def make_project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(REPO / "examples" / "r3_mini", proj / "examples" / "r3_mini",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "protocol").mkdir()
    (proj / "manifests").mkdir()
    shutil.copy(REPO / "protocol" / "r3_mini.yaml", proj / "protocol" / "r3_mini.yaml")
    shutil.copy(REPO / "manifests" / "r3_mini.json", proj / "manifests" / "r3_mini.json")
    shutil.copytree(REPO / "recipes", proj / "recipes")  # the frozen recipe file the protocol names
    return proj


def edit_protocol(
    proj: Path, change: Callable[[dict], None], name: str = "p.yaml", source: str = "r3_mini.yaml"  # type: ignore[type-arg]
) -> Path:
    """protocol/NAME: protocol/SOURCE (r3-mini's, or MINIMAL_PROTOCOL) after `change`."""
    data = yaml.safe_load((proj / "protocol" / source).read_text())
    change(data)
    path = proj / "protocol" / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def orch(*args: str, cwd: Path) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli.orch", *args]


def env() -> dict[str, str]:
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def launch_cmd(proj: Path, protocol: Path, home: Path) -> list[str]:
    return orch("launch", str(protocol), "--home", str(home), "--json", "--lock-dir", str(home.parent / "locks"),
                cwd=proj)


STARTED: list[subprocess.Popen[str]] = []  # ended after each test (conftest.py): no launch outlives its test


def start(proj: Path, protocol: Path, home: Path) -> subprocess.Popen[str]:
    proc = subprocess.Popen(launch_cmd(proj, protocol, home), cwd=proj, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    STARTED.append(proc)
    return proc


def end_started() -> None:
    """Kill every launch a test started that still runs (the test failed or timed out before it ended)."""
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def start_until(
    proj: Path, home: Path, package: str, protocol: Path | None = None
) -> tuple[subprocess.Popen[str], Path]:
    """Launch `protocol` (default: the shipped one) and return once `package` has completed one step."""
    proc = start(proj, protocol or proj / "protocol" / "r3_mini.yaml", home)
    # upper bounds only (a loaded 2-core host takes minutes to start a run); a test that fails here ends the launch
    wait_for(lambda: run_published(home), 300, "the run directory")
    run_dir = only_run(home)
    wait_for(lambda: steps_done(run_dir, package) >= 1 or proc.poll() is not None, 600, f"{package} to run")
    assert proc.poll() is None, f"the launch ended before {package} ran: {proc.communicate()[1][-3000:]}"
    return proc, run_dir


def wait_for(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def run_published(home: Path) -> bool:
    """The run folder is in place: renamed from its staging name (runs/.new-<id>), which a test must never take
    for the run (it vanishes at the rename, and a wait on a file under it never ends)."""
    runs = home / "runs"
    return runs.is_dir() and any(not p.name.startswith(STAGING_PREFIX) for p in runs.iterdir())


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
