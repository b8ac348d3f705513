"""orch installed as a tool (issue 33): the wheel built from this tree, installed into a fresh virtual environment, runs
`orch freeze`, `orch launch` and `orch audit` of a small short-form protocol from a git project outside the
repository. No network: the wheel's dependencies are this environment's packages (its site-packages folder appended
to the new environment's path by a .pth line, whose own .pth files, this tree's editable install among them, are not
read), and the wheel is installed with --no-index --no-deps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import yaml
from launchutil import GIT, MINIMAL, REPO, lay_out_minimal, one_rank

from protocol.recipe import load_recipe, recipe_flags

pytestmark = pytest.mark.slow
# what the wheel is built from: the packaging files and the packages' tracked files (the tree as it is now)
BUILT_FROM = ["pyproject.toml", "README.md", "protocol", "orchestrator", "workers", "ledger", "manifests", "recipes"]


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{cmd[:3]} exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def _wheel(tmp: Path) -> Path:
    src = tmp / "src"
    listed = _run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *BUILT_FROM], cwd=REPO)
    for rel in filter(None, listed.split("\0")):
        if (REPO / rel).exists() or (REPO / rel).is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel, follow_symlinks=False)
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("orch-*.whl")
    return wheel


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """bin/ of a fresh virtual environment holding orch from its wheel (and this environment's packages)."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheel = _wheel(tmp)
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    py = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index", "--no-deps", str(wheel)],
         cwd=tmp)
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip())
    (site / "zz_orch_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def _env() -> dict[str, str]:
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "ORCH_HOME"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONUNBUFFERED": "1"}


def _project(root: Path) -> Path:
    """A git project of its own: the minimal trainer (launchutil.lay_out_minimal: the test is about the installed
    tool, not r3-mini), its recipe file and its short-form protocol (no `recipe:`, no recipe flag) on one rank. The
    commitment is made here by the installed orch."""
    proj = root / "proj"
    lay_out_minimal(proj)
    data = yaml.safe_load((MINIMAL / "protocol.yaml").read_text())
    assert "recipe" not in data and data["launcher"]["args"] == []  # the short form
    one_rank(data)
    data["name"] = "wheel-install"
    (proj / "protocol").mkdir()
    (proj / "protocol" / "one.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    (proj / "manifests").mkdir()
    _run(["git", "init", "-q"], cwd=proj)
    return proj


def test_the_wheel_gives_orch_and_gpu_run_that_freeze_launch_and_audit_outside_the_repository(
        tool: Path, tmp_path: Path) -> None:
    env = _env()
    assert _run([str(tool / "orch"), "--version"], cwd=tmp_path, env=env).strip() == "orch 0.1.0"
    assert "gpu-run" in _run([str(tool / "gpu-run"), "--help"], cwd=tmp_path, env=env)
    where = _run([str(tool / "python"), "-c", "import orchestrator, workers.probe, protocol.recipe as r; "
                  "print(orchestrator.__file__); print(r.v1_recipe().sha256)"], cwd=tmp_path, env=env).split()
    assert where[0].startswith(str(tool.parent)) and not where[0].startswith(str(REPO))  # the wheel's, not this tree's
    assert where[1] == "27ea00d8ce839a2cf57981cca87348d24d80e5eda3849bcfee9e591df511961e"  # R3's recipe ships
    proj = _project(tmp_path)
    orch = str(tool / "orch")
    _run([orch, "freeze", "--protocol", "protocol/one.yaml", "-o", "manifests/minimal.json"], cwd=proj, env=env)
    _run([*GIT, "add", "-A"], cwd=proj)
    _run([*GIT, "commit", "-q", "-m", "trainer, recipe, protocol, commitment"], cwd=proj)
    home = tmp_path / "home"
    launched = subprocess.run(
        [orch, "launch", "protocol/one.yaml", "--home", str(home), "--json", "--lock-dir", str(tmp_path / "locks")],
        cwd=proj, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert launched.returncode == 0, launched.stderr[-3000:]
    summary = json.loads(launched.stdout)
    assert summary["status"] == "complete", summary
    run_id = summary["run_id"]
    shown = _run([orch, "audit", run_id, "--home", str(home), "--json"], cwd=proj, env=env)
    audit = json.loads(shown.strip().splitlines()[-1])["audit"]
    assert audit["exact"] is True, audit["reasons"]
    # the run record shows the command orch rendered: the script, then the recipe's flags, then launcher.args
    run = json.loads((home / "runs" / run_id / "run.json").read_text())
    command = run["arms"]["candidate"]["command"]
    assert audit["commands"] == {"baseline": run["arms"]["baseline"]["command"], "candidate": command}  # and the audit
    flags = recipe_flags(load_recipe(proj / "recipes" / "minimal.yaml", "recipes/minimal.yaml", None).recipe)
    assert command == ["train.py", *flags] and flags[:2] == ["--lr", "0.001"], command
