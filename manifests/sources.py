"""Where an arm's sources come from: the working tree, or an export of `git archive REV`.

Used by `orch freeze --protocol` and the launcher, so both hash the same tree the same way.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from protocol.errors import RefusedError
from protocol.schema import Arm, LoadedProtocol


def git_toplevel(path: Path) -> Path:
    out = subprocess.run(
        ["git", "-C", str(path), "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise RefusedError(f"{path}: not inside a git repository; a git source needs one")
    return Path(out.stdout.strip())


def export_git_tree(root: Path, rev: str, dest: Path) -> Path:
    """Extract the sources root as of revision `rev` of its own repository into dest with `git archive`."""
    top = git_toplevel(root)
    rel = root.resolve().relative_to(top.resolve()).as_posix()
    proc = subprocess.run(
        ["git", "-C", str(top), "archive", "--format=tar", rev, "--", rel], capture_output=True, check=False
    )
    if proc.returncode != 0:
        msg = proc.stderr.decode(errors="replace").strip().splitlines()
        raise RefusedError(f"git archive {rev} -- {rel} failed ({msg[-1] if msg else 'no output'}); check the rev")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / rel if rel != "." else dest


def arm_source_dir(loaded: LoadedProtocol, arm: Arm, workdir: Path) -> Path:
    """The directory holding the arm's sources root: the working tree, or an export of its git revision."""
    root = loaded.resolve(loaded.protocol.sources.root)
    if arm.source == "tree":
        return root
    out = workdir / "git-export"
    if out.exists():
        shutil.rmtree(out)
    return export_git_tree(root, arm.source.git, out)
