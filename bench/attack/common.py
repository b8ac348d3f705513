"""What every attack of the battery shares: the orch CLI as a user runs it, r3-mini project copies, launches in
the background, the ledger as any Arrow reader sees it, the run's processes and the lock files.

Nothing here simulates a result: each helper starts a real process, sends a real signal or changes real bytes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pyarrow.ipc as ipc
import yaml

REPO = Path(__file__).resolve().parents[2]
TRAINER = Path("examples") / "r3_mini" / "train" / "online_rl.py"
UTILS = Path("examples") / "r3_mini" / "train" / "train_utils.py"
SCORER = Path("examples") / "r3_mini" / "train" / "score.py"
ANCHOR = "        scheduler.step()\n"
# shorter rollouts (decode tokens, denoise steps) only, the same for every arm: model, initial state, recipe unchanged
SMALL = ["--max_output_token_n_gen", "8", "--max_output_token_n_edit", "8",
         "--num_timesteps_gen", "4", "--num_timesteps_edit", "4"]
GIT = ["git", "-c", "user.name=orch-attack", "-c", "user.email=orch-attack@example.invalid",
       "-c", "commit.gpgsign=false"]
Edit = tuple[Path, str, str]  # (file under the project, a line that occurs once, lines inserted after it)


@dataclass
class Row:
    """One attack: what it is, what orch must do, what it did."""

    family: str  # cheat | fault | tamper | input
    name: str
    expected: str
    observed: str = ""
    ok: bool = False
    seconds: float = 0.0


class Check:
    """Collects the conditions of one attack; the attack passes only when every one held."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.held: list[str] = []
        self.seen: list[str] = []

    def that(self, cond: bool, what: str) -> bool:
        (self.held if cond else self.failed).append(what)
        return cond

    def saw(self, text: str) -> None:
        self.seen.append(text)

    def observed(self) -> str:
        parts = [*self.seen, *(["held: " + ", ".join(self.held)] if self.held else []),
                 *(f"NOT: {f}" for f in self.failed)]
        return "; ".join(parts)


@dataclass
class Work:
    """The battery's folders. They live under the repository's .orch/ (git-ignored), where `orch launch` keeps its
    default home, so that a package sees the home exactly as it would in a user's checkout."""

    root: Path
    n: int = 0

    def fresh(self, tag: str) -> Path:
        self.n += 1
        path = self.root / f"{self.n:02d}-{tag}"
        path.mkdir(parents=True)
        return path

    def scrub(self, text: str) -> str:
        """Observed text as evidence may show it: no absolute path of this machine."""
        for prefix, name in ((str(self.root), "<work>"), (str(REPO), "<repo>"), (str(Path.home()), "~")):
            text = text.replace(prefix, name)
        return relative_to_project(text)


def relative_to_project(text: str) -> str:
    """An attack's project folder (<work>/NN-tag/) left out and its orch home written $ORCH_HOME: evidence names
    files the way a user of that project would, never a folder of this machine."""
    text = re.sub(r"<work>/\d\d-[\w.-]+/home/", "$ORCH_HOME/", text)
    return re.sub(r"<work>/\d\d-[\w.-]+/", "", text)


def orch_argv(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("orch")
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "orchestrator.cli.orch", *args]


def gpu_run_argv(*args: str) -> list[str]:
    exe = Path(sys.executable).with_name("gpu-run")
    return [str(exe), *args]


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    out = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1", "NO_COLOR": "1"}
    out.pop("ORCH_HOME", None)
    out.pop("ORCH_WITNESS", None)
    return {**out, **(extra or {})}


def cli(argv: Sequence[str], cwd: Path, extra_env: dict[str, str] | None = None, timeout: float = 300,
        preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), cwd=cwd, env=env(extra_env), capture_output=True, text=True, timeout=timeout,
                          preexec_fn=preexec, check=False)


def lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def make_project(dest: Path) -> Path:
    """A copy of r3-mini as a user's project: sources, the shipped protocol (rollouts shortened) and its commitment."""
    proj = dest / "proj"
    shutil.copytree(REPO / "examples" / "r3_mini", proj / "examples" / "r3_mini",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (proj / "protocol").mkdir()
    (proj / "manifests").mkdir()
    shutil.copy(REPO / "protocol" / "r3_mini.yaml", proj / "protocol" / "r3_mini.yaml")
    shutil.copy(REPO / "manifests" / "r3_mini.json", proj / "manifests" / "r3_mini.json")
    shutil.copytree(REPO / "recipes", proj / "recipes")  # the frozen recipe file the protocol names
    write_protocol(proj, "small.yaml", lambda d: None)
    return proj


def write_protocol(proj: Path, name: str, change: Callable[[dict[str, Any]], None], small: bool = True) -> Path:
    data = yaml.safe_load((proj / "protocol" / "r3_mini.yaml").read_text())
    if small:
        data["launcher"]["args"] = [*data["launcher"]["args"], *SMALL]
        data["scorer"]["command"] = [*data["scorer"]["command"], *SMALL]
    change(data)
    path = proj / "protocol" / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def checks_only(proj: Path, name: str, command: list[str]) -> Path:
    """A protocol whose checks package runs `command` and no trainer: a launch that costs seconds."""
    def change(d: dict[str, Any]) -> None:
        d["checks"] = {"prepare": [{"name": "step", "command": command}], "diagnostics": [], "static_graph": None}
    return write_protocol(proj, name, change)


def edit_file(path: Path, anchor: str, insert: str) -> None:
    text = path.read_text()
    if text.count(anchor) != 1:
        raise RuntimeError(f"{path.name}: anchor {anchor.strip()!r} occurs {text.count(anchor)} times")
    path.write_text(text.replace(anchor, anchor + insert))


def candidate_project(dest: Path, edits: Sequence[Edit]) -> tuple[Path, Path]:
    """A committed project whose working tree is a patched candidate: baseline = `git archive HEAD` under the
    published commitment, candidate = the edited tree under a commitment frozen by `orch freeze`, same switches."""
    proj = make_project(dest)
    subprocess.run(["git", "init", "-q", str(proj)], check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=proj, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "baseline"], cwd=proj, check=True)
    for rel, anchor, insert in edits:
        edit_file(proj / rel, anchor, insert)

    def change(d: dict[str, Any]) -> None:
        switches = {key: "1" for key in d["arms"]["candidate"]["switches"]}
        d["arms"] = {
            "baseline": {"commitment": "manifests/r3_mini.json", "source": {"git": "HEAD"}, "switches": switches},
            "candidate": {"commitment": "manifests/r3_mini_cand.json", "source": "tree", "switches": dict(switches),
                          "under_evaluation": True},
        }
    protocol = write_protocol(proj, "candidate.yaml", change)
    frozen = cli(orch_argv("freeze", "--protocol", str(protocol), "--arm", "candidate", "-o",
                           "manifests/r3_mini_cand.json"), cwd=proj, timeout=120)
    if frozen.returncode != 0:
        raise RuntimeError(f"orch freeze of the candidate failed: {frozen.stderr.strip()}")
    return proj, protocol


class Launch:
    """One `orch launch --json` in the background; stdout and stderr in files, readable while it runs."""

    def __init__(self, proj: Path, protocol: Path, home: Path, tag: str, extra_env: dict[str, str] | None = None,
                 ignore_sigint: bool = False, lock_dir: Path | None = None, args: Sequence[str] = ()) -> None:
        self.home = home
        base = home.parent
        base.mkdir(parents=True, exist_ok=True)
        self.out, self.err = base / f"{tag}.out", base / f"{tag}.err"
        self.lock_dir = lock_dir or base / "locks"

        def pre() -> None:
            os.nice(0)
            if ignore_sigint:
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a background job of a script starts

        argv = orch_argv("launch", str(protocol), "--home", str(home), "--json", "--lock-dir", str(self.lock_dir),
                         *args)
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(argv, cwd=proj, env=env(extra_env), stdout=out, stderr=err, text=True,
                                         preexec_fn=pre)
        self.started = time.monotonic()

    @property
    def stderr(self) -> str:
        return self.err.read_text()

    @property
    def stdout(self) -> str:
        return self.out.read_text()

    def run_id(self, timeout: float = 120) -> str:
        wait_for(lambda: any(ln.startswith("run ") for ln in self.stderr.splitlines()) or self.proc.poll() is not None,
                 timeout, "the run id")
        found = [ln.split()[1] for ln in self.stderr.splitlines() if ln.startswith("run ")]
        if not found:
            raise RuntimeError(f"launch printed no run id: {self.stderr.strip()[-500:]}")
        return found[0]

    @property
    def run_dir(self) -> Path:
        return self.home / "runs" / self.run_id()

    def started_package(self, package: str) -> bool:
        return f"{package}: started" in self.stderr

    def wait_package(self, package: str, timeout: float = 600, steps: int = 0) -> None:
        """Until `package` has started (and, for a train package, has done `steps` steps), or the launch ended."""
        def ready() -> bool:
            if self.proc.poll() is not None:
                return True
            if not self.started_package(package):
                return False
            return steps == 0 or steps_done(self.run_dir, package) >= steps
        wait_for(ready, timeout, f"{package} to run")
        if self.proc.poll() is not None:
            raise RuntimeError(f"launch ended before {package} ran: {self.stderr.strip()[-800:]}")

    def wait(self, timeout: float = 900) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def wait_for(pred: Callable[[], bool], timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(every)
    raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")


def steps_done(run_dir: Path, package: str) -> int:
    path = run_dir / "packages" / package / "steps.rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def records(home: Path) -> list[dict[str, Any]]:
    """The ledger as any Arrow reader sees it (no orch code)."""
    path = home / "ledger" / "ledger.arrows"
    if not path.exists():
        return []
    with ipc.open_stream(str(path)) as reader:
        return reader.read_all().to_pylist()  # type: ignore[no-any-return]


def closes(home: Path, run_id: str) -> dict[str, str]:
    return {r["package"]: r["status"] for r in records(home) if r["run_id"] == run_id and r["status"] != "open"}


def run_processes(run_id: str) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get("ORCH_RUN_ID") == run_id:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def no_process_left(run_id: str, within: float = 10) -> bool:
    try:
        wait_for(lambda: not run_processes(run_id), within, "the run's processes to end")
    except RuntimeError:
        return False
    return True


def lock_free(lock_dir: Path, slots: int = 2) -> bool:
    """Whether util-linux flock gets every slot lock at once, without waiting: nobody holds the run's lock."""
    for i in range(slots):
        path = lock_dir / f"slot{i}.lock"
        if path.exists() and subprocess.run(["flock", "-n", str(path), "true"], check=False).returncode != 0:
            return False
    return True


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def snapshot(home: Path, backup: Path) -> None:
    """A byte copy of a home (modes kept) to restore after an attack that changes it."""
    if backup.exists():
        remove_tree(backup)
    subprocess.run(["cp", "-a", str(home), str(backup)], check=True)


def restore(home: Path, backup: Path) -> None:
    remove_tree(home)
    subprocess.run(["cp", "-a", str(backup), str(home)], check=True)


def remove_tree(path: Path) -> None:
    if not path.exists():
        return
    subprocess.run(["chmod", "-R", "u+w", str(path)], check=False)
    shutil.rmtree(path)


@dataclass
class Reference:
    """The one sealed, complete run that read-only attacks (and restored tampers) share."""

    proj: Path
    home: Path
    run_id: str
    audit_exit: int
    witness: Path  # $ORCH_WITNESS: a head kept outside the home
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.home / "runs" / self.run_id
