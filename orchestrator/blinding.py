"""Blinding of what a trainer writes itself: its output folder stays in scratch, sealed, and never reaches evidence.

Upstream R3 evaluates at step 0 and writes an HTML report with generated images under --log_dir (`{trainer_dir}`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

from ledger.files.hygiene import classify_bytes
from protocol.hashing import file_sha256

# what may stay in a package's run folder although the trainer wrote it: nothing the hygiene scan calls a
# checkpoint, tensor, image, trace or reward trace, and no HTML report (the trainer's evaluation pages)
_REPORT_EXTS = (".html", ".htm")


def _kind(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            head = f.read(64)
    except OSError:
        return None
    found = classify_bytes(path.name, head)
    if found is not None:
        return found[0]
    return "report" if path.name.lower().endswith(_REPORT_EXTS) else None


def quarantine(package_dir: Path, trainer_dir: Path) -> list[str]:
    """Move trainer-made images, reports, checkpoints and traces out of the run folder into the sealed trainer dir.

    Returns the kinds moved (one entry per file), never their names: names of generated files are not evidence.
    """
    moved: list[str] = []
    if not package_dir.is_dir():
        return moved
    target = trainer_dir / "from-package-dir"
    for path in sorted(p for p in package_dir.rglob("*") if p.is_file() and not p.is_symlink()):
        kind = _kind(path)
        if kind is None:
            continue
        dest = target / path.relative_to(package_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), dest)
        moved.append(kind)
    return moved


def seal_outputs(trainer_dir: Path) -> dict[str, object]:
    """Digest and make read-only the trainer's own outputs; the summary holds counts and one digest, no names."""
    present = trainer_dir.is_dir()
    files = sorted(p for p in trainer_dir.rglob("*") if p.is_file() and not p.is_symlink()) if present else []
    tree = hashlib.sha256()
    total = 0
    kinds: dict[str, int] = {}
    for path in files:
        rel = path.relative_to(trainer_dir).as_posix()
        digest, size = file_sha256(path)
        total += size
        tree.update(f"{digest}  {rel}\n".encode())
        kind = _kind(path) or "other"
        kinds[kind] = kinds.get(kind, 0) + 1
        path.chmod(stat.S_IRUSR)
    for d in sorted((p for p in trainer_dir.rglob("*") if p.is_dir()), reverse=True) if present else []:
        os.chmod(d, stat.S_IRUSR | stat.S_IXUSR)
    return {"files": len(files), "bytes": total, "sha256": tree.hexdigest(), "kinds": dict(sorted(kinds.items()))}
