"""Sealing an arm: a read-only copy of its verified sources that packages run from, hashed again after each.

Edits of the working tree during a run cannot reach a sealed copy; a write into one fails the run, path named.
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from manifests.core import Manifest, diff_manifests, hash_tree
from protocol.errors import FailedError, RefusedError
from protocol.home import is_home

_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")


def _ignore(folder: str, names: list[str]) -> set[str]:
    """What a sealed copy leaves out: caches, .git, and any orch home (./.orch of a root `.`: it holds the copy)."""
    return set(_IGNORE(folder, names)) | {n for n in names if is_home(Path(folder, n))}


@dataclass(frozen=True)
class SealedArm:
    arm: str
    path: Path
    manifest: Manifest  # every file of the sealed copy (what is re-hashed after each package)
    sources: Manifest  # the included sources (root equals the commitment's when verified)

    def beyond_include(self) -> list[str]:
        """What the sealed copy holds beyond the include globs (not in the commitment; run.json lists it)."""
        included = {e.path for e in self.sources.entries}
        return [e.path for e in self.manifest.entries if e.path not in included]


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            if not stat.S_ISLNK(mode):
                os.chmod(p, stat.S_IMODE(mode) & ~0o222)
        for name in dirnames:
            p = os.path.join(dirpath, name)
            os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222)
    os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) & ~0o222)


ORCH_ROOT = Path(__file__).resolve().parents[2]


def orch_packages() -> tuple[str, ...]:
    """The top-level packages orch's workers import (workers, protocol, ledger, manifests, orchestrator)."""
    return tuple(sorted(p.name for p in ORCH_ROOT.iterdir() if (p / "__init__.py").is_file()))


def shadowing(source_dir: Path, pythonpath: str) -> list[str]:
    """Entries of an arm's tree that would be imported under the name of one of orch's packages: at its root and in
    every folder of the protocol's PYTHONPATH inside it (a package 'workers/', a module 'protocol.py', ...). A rank
    imports orch's probe before the trainer's folders are on its path, so the trainer would get orch's package."""
    roots = [source_dir]
    for entry in filter(None, pythonpath.split(os.pathsep)):
        folder = (source_dir / entry).resolve() if not os.path.isabs(entry) else Path(entry)
        if folder.is_dir() and folder.is_relative_to(source_dir.resolve()) and folder not in roots:
            roots.append(folder)
    names = orch_packages()
    found = []
    for root in roots:
        for entry in sorted(os.listdir(root)):
            stem = entry.split(".", 1)[0]
            # a folder without __init__.py is at most a namespace portion: Python still imports orch's regular
            # package of that name, wherever it is on the path (a project's data folder `protocol/` is no module)
            is_module = entry.endswith((".py", ".pyc", ".so")) or (root / entry / "__init__.py").is_file()
            if stem in names and is_module:
                rel = (root / entry).relative_to(source_dir.resolve()) if root != source_dir else Path(entry)
                found.append(f"{rel.as_posix()}{'/' if (root / entry).is_dir() else ''}")
    return found


def seal_arm(arm: str, source_dir: Path, include: list[str], expected_root: str, dest: Path) -> SealedArm:
    """Copy source_dir to dest, check the included sources against expected_root, make it read-only."""
    try:
        shutil.copytree(source_dir, dest, ignore=_ignore, symlinks=True)
    except shutil.Error as err:  # one line per file would be kilobytes: the first failure and the count
        failures = [e for e in err.args[0] if isinstance(e, tuple) and len(e) == 3] if err.args else []
        src, _, why = failures[0] if failures else ("", "", str(err))
        rel = os.path.relpath(src, source_dir) if src else "?"
        first = f"{rel[:120]} ({str(why).replace(str(src), rel)[:200]})"
        raise FailedError(f"cannot seal {arm}: {len(failures) or 'some'} file(s) not copied from {source_dir}, "
                          f"first {first}; make them readable, or leave them out of sources.root") from None
    included = hash_tree(dest, include)
    if included.root != expected_root:
        raise RefusedError(
            f"sealed copy of {arm} does not hash to its verified root ({included.root[:12]} != {expected_root[:12]}); "
            "the sources changed while sealing: launch again"
        )
    manifest = hash_tree(dest, ["**"])
    _make_read_only(dest)
    return SealedArm(arm=arm, path=dest, manifest=manifest, sources=included)


def check_seal(sealed: SealedArm) -> None:
    """Hash the sealed copy again; FailedError naming the changed paths if anything differs."""
    try:
        now = hash_tree(sealed.path, ["**"])
    except RefusedError as err:
        raise FailedError(f"sealed copy of {sealed.arm} cannot be re-hashed: {err.message}") from None
    diff = diff_manifests(sealed.manifest, now)
    if not diff.equal:
        raise FailedError(f"sealed copy of {sealed.arm} was modified during the run: {diff.summary()}")


def unseal_for_removal(root: Path) -> None:
    """Give write permission back so that a sealed tree can be deleted (scratch only; evidence stays)."""
    if os.path.islink(root):
        return
    for dirpath, dirnames, _ in os.walk(root):
        for name in dirnames:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            if stat.S_ISDIR(mode):  # os.walk lists a link to a folder among the folders: chmod would follow it
                os.chmod(p, stat.S_IMODE(mode) | 0o700)
    os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) | 0o700)
