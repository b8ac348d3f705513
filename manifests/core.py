"""Hashing a source tree into a manifest (sorted relative POSIX paths -> SHA256 of raw bytes) and diffing two.

The root digest is the SHA256 of the canonical JSON of the entry list, so it depends on contents and names only.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import RefusedError

MANIFEST_SCHEMA = "orch.manifest/1"
_CHUNK = 1 << 20


class Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    sha256: str
    size: int


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: str = Field(MANIFEST_SCHEMA, alias="schema")
    root: str
    include: list[str]
    entries: list[Entry]

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=1, sort_keys=True) + "\n"

    def to_sha256sum(self) -> str:
        return "".join(f"{e.sha256}  {e.path}\n" for e in self.entries)


def root_digest(entries: Iterable[Entry]) -> str:
    canonical = [e.model_dump() for e in sorted(entries, key=lambda e: e.path)]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_sha256(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def select_files(root: Path, include: Sequence[str]) -> list[str]:
    """Sorted relative POSIX paths of the regular files under root matched by the include globs.

    Refuses (exit 3) an include that matches nothing and a symlink that leaves the root.
    """
    if not root.is_dir():
        raise RefusedError(f"{root}: not a directory; give the root of the sources")
    real_root = root.resolve()
    selected: set[str] = set()
    for pattern in include:
        if pattern.startswith("/") or ".." in Path(pattern).parts:
            raise RefusedError(f"include {pattern!r} leaves the root; use a glob relative to {root}")
        matched = False
        for path in root.glob(pattern):
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(real_root):
                    rel = path.relative_to(root).as_posix()
                    raise RefusedError(f"{rel}: symlink leaves the root ({target}); replace it with a file")
            if path.is_dir():
                continue
            if not path.is_file():
                continue
            resolved = path.resolve()
            if not resolved.is_relative_to(real_root):
                raise RefusedError(f"{path}: leaves the root through a symlinked folder; copy it in instead")
            selected.add(path.relative_to(root).as_posix())
            matched = True
        if not matched:
            raise RefusedError(f"include {pattern!r} matches no file under {root}; fix the glob")
    return sorted(selected)


def _hash_one(root: Path, rel: str) -> Entry:
    try:
        digest, size = file_sha256(root / rel)
    except PermissionError:
        raise RefusedError(f"{rel}: unreadable (permission denied); fix its permissions") from None
    except OSError as err:
        raise RefusedError(f"{rel}: cannot be read ({err.strerror}); fix or exclude it") from None
    return Entry(path=rel, sha256=digest, size=size)


def hash_tree(root: Path, include: Sequence[str], workers: int | None = None) -> Manifest:
    """Manifest of the files under root selected by include; many files are hashed on every core."""
    files = select_files(root, include)
    if workers is None:
        workers = min(8, (os.cpu_count() or 1) * 2)
    if len(files) < 16 or workers <= 1:
        entries = [_hash_one(root, rel) for rel in files]
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            entries = list(pool.map(lambda rel: _hash_one(root, rel), files, chunksize=16))
    return Manifest(root=root_digest(entries), include=list(include), entries=entries)


@dataclass(frozen=True)
class ManifestDiff:
    added: list[str]
    removed: list[str]
    changed: list[str]

    @property
    def equal(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def summary(self, limit: int = 5) -> str:
        parts = []
        for label, paths in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if paths:
                shown = ", ".join(paths[:limit]) + (", ..." if len(paths) > limit else "")
                parts.append(f"{len(paths)} {label} ({shown})")
        return "; ".join(parts) if parts else "equal"

    def lines(self) -> list[str]:
        return (
            [f"changed  {p}" for p in self.changed]
            + [f"added    {p}" for p in self.added]
            + [f"removed  {p}" for p in self.removed]
        )


def diff_manifests(expected: Manifest, actual: Manifest) -> ManifestDiff:
    exp = {e.path: e.sha256 for e in expected.entries}
    act = {e.path: e.sha256 for e in actual.entries}
    return ManifestDiff(
        added=sorted(set(act) - set(exp)),
        removed=sorted(set(exp) - set(act)),
        changed=sorted(p for p in set(exp) & set(act) if exp[p] != act[p]),
    )


def load_manifest(path: Path) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(path.read_text())
    except OSError as err:
        raise RefusedError(f"{path}: cannot read the commitment ({err.strerror}); run `orch freeze` first") from None
    except ValueError as err:
        raise RefusedError(f"{path}: not a valid manifest ({str(err).splitlines()[0]}); re-run `orch freeze`") from None
    if root_digest(manifest.entries) != manifest.root:
        raise RefusedError(f"{path}: root digest does not match its entries; the commitment file was altered")
    return manifest


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
