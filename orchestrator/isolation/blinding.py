"""Blinding of what a trainer writes itself: its output folder stays in scratch, sealed, and never reaches evidence.

Upstream R3 evaluates at step 0 and writes an HTML report with generated images under --log_dir (`{trainer_dir}`).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from ledger.files.hygiene import classify_bytes
from orchestrator.isolation.safe_paths import (
    UnsafeEntry,
    make_dirs,
    move_file,
    open_dir,
    open_dir_at,
    open_regular,
    opened_dir,
    tree_entries,
    walk,
)
from protocol.hashing import sha256_fd

# what may stay in a package's run folder although the trainer wrote it: nothing the hygiene scan calls a
# checkpoint, tensor, image, trace or reward trace, and no HTML report (the trainer's evaluation pages)
_REPORT_EXTS = (".html", ".htm")
QUARANTINE = "quarantine"  # scratch/quarantine/NAME: what quarantine moved out of package NAME's run folder


def _kind(dir_fd: int, name: str) -> str | None:
    try:
        fd = open_regular(dir_fd, name, name)
    except OSError:
        return None
    try:
        head = os.read(fd, 64)
    finally:
        os.close(fd)
    found = classify_bytes(name, head)
    if found is not None:
        return found[0]
    return "report" if name.lower().endswith(_REPORT_EXTS) else None


def quarantine(package_dir: Path, scratch: Path, name: str) -> list[str]:
    """Move trainer-made images, reports, checkpoints and traces out of the run folder into a folder orch makes for
    them, scratch/quarantine/NAME (no package can write there; it must not exist yet). Nothing is followed: a link in
    the run folder stays where it is (the package fails for it: special_entries), and every move is a rename between
    descriptors, so a folder the package swapped for a link can never redirect a file.

    Returns the kinds moved (one entry per file), never their names: names of generated files are not evidence.
    """
    moved: list[str] = []
    try:
        pkg_fd = open_dir(package_dir)
    except FileNotFoundError:
        return moved
    target: int | None = None
    try:
        for entry in walk(pkg_fd):
            if entry.kind != "file":
                continue
            folder, _, base = entry.rel.rpartition("/")
            with opened_dir(package_dir, folder) as src:
                kind = _kind(src, base)
                if kind is None:
                    continue
                if target is None:
                    with opened_dir(scratch) as scratch_fd:
                        target = make_dirs(scratch_fd, f"{QUARANTINE}/{name}", fresh_last=True)
                dst = make_dirs(target, folder) if folder else os.dup(target)
                try:
                    move_file(src, base, dst, base)
                finally:
                    os.close(dst)
            moved.append(kind)
    finally:
        os.close(pkg_fd)
        if target is not None:
            os.close(target)
    return moved


def special_entries(folder: Path) -> list[str]:
    """What a folder holds besides regular files and folders (links, FIFOs, sockets, devices), as 'rel (kind)':
    a package's run folder may hold only its files, which orch and the audit read."""
    return [f"{e.rel} ({e.kind})" for e in tree_entries(folder) if e.kind not in ("file", "folder")]


def seal_outputs(scratch: Path, name: str) -> dict[str, object]:
    """Digest and make read-only the trainer's own outputs (scratch/trainer/NAME) and what quarantine moved out of
    its run folder (as from-package-dir/...); the summary holds counts and one digest, no names. Through descriptors
    only: a link is counted (kind 'link'), never followed, hashed or chmodded."""
    tree = hashlib.sha256()
    total = files = 0
    kinds: dict[str, int] = {}
    for rel_root, prefix in ((f"trainer/{name}", ""), (f"{QUARANTINE}/{name}", "from-package-dir/")):
        try:
            root = open_dir(scratch, rel_root)
        except FileNotFoundError:
            continue
        try:
            for entry in walk(root):
                if entry.kind == "folder":
                    continue
                if entry.kind != "file":
                    kinds[entry.kind] = kinds.get(entry.kind, 0) + 1
                    continue
                folder, _, base = entry.rel.rpartition("/")
                with opened_dir(scratch, f"{rel_root}/{folder}" if folder else rel_root) as dfd:
                    try:
                        fd = open_regular(dfd, base, entry.rel)
                    except OSError:
                        continue
                    try:
                        digest, size = sha256_fd(fd)
                        os.fchmod(fd, stat.S_IRUSR)
                    finally:
                        os.close(fd)
                    kind = _kind(dfd, base) or "other"
                files += 1
                total += size
                tree.update(f"{digest}  {prefix}{entry.rel}\n".encode())
                kinds[kind] = kinds.get(kind, 0) + 1
            _seal_folders(root)
        finally:
            os.close(root)
    return {"files": files, "bytes": total, "sha256": tree.hexdigest(), "kinds": dict(sorted(kinds.items()))}


def _seal_folders(dir_fd: int) -> None:
    """r-x for the owner on every folder below an open one and on it, through descriptors."""
    for entry_name in os.listdir(dir_fd):
        try:
            sub = open_dir_at(dir_fd, entry_name)
        except (UnsafeEntry, FileNotFoundError, NotADirectoryError):
            continue
        try:
            _seal_folders(sub)
        finally:
            os.close(sub)
    os.fchmod(dir_fd, stat.S_IRUSR | stat.S_IXUSR)
