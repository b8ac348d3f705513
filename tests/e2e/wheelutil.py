"""orch as a user installs it (issues 33, 53): the wheel built from this tree's tracked files, installed into a fresh
virtual environment with no network. The wheel's dependencies are this environment's packages: its site-packages
folder is appended to the new environment's path by a .pth line, whose own .pth files (this tree's editable install
among them) are not read; the wheel is installed with --no-index --no-deps."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from launchutil import REPO

# what the wheel is built from: the packaging files and the packages' tracked files (the tree as it is now)
BUILT_FROM = ["pyproject.toml", "README.md", "protocol", "orchestrator", "workers", "ledger", "manifests", "recipes"]


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 300) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"{cmd[:3]} exit {done.returncode}: {done.stderr[-3000:]}"
    return done.stdout


def build_wheel(tmp: Path) -> Path:
    src = tmp / "src"
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *BUILT_FROM], cwd=REPO)
    for rel in filter(None, listed.split("\0")):
        if (REPO / rel).exists() or (REPO / rel).is_symlink():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel, follow_symlinks=False)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(tmp / "dist"), str(src)], cwd=tmp)
    (wheel,) = (tmp / "dist").glob("orch-*.whl")
    return wheel


def installed_tool(tmp: Path) -> Path:
    """bin/ of a fresh virtual environment holding orch from its wheel (and this environment's packages)."""
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp)
    py = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-index", "--no-deps", str(wheel)],
        cwd=tmp)
    site = Path(run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp).strip())
    (site / "zz_orch_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv / "bin"


def user_env() -> dict[str, str]:
    """The environment a user's shell has: no PYTHONPATH into this tree, no virtual environment active, no home set."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "ORCH_HOME"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "PYTHONUNBUFFERED": "1"}
