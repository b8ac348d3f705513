"""Hashing a source tree into a manifest (sorted relative POSIX paths -> SHA256 of raw bytes) and diffing two.

The root digest is the SHA256 of the canonical JSON of the entry list, so it depends on contents and names only.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from protocol.errors import RefusedError
from protocol.hashing import canonical_json, file_sha256
from protocol.home import is_home

MANIFEST_SCHEMA = "orch.manifest/1"
_PARALLEL_MIN_FILES = 2000


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
    # where the hashed tree lives, relative to the repository holding the manifest; not part of the root digest
    sources_root: str | None = None

    def to_json(self) -> str:
        return canonical_json(self.model_dump(mode="json", by_alias=True, exclude_none=True), ensure_ascii=True,
                              pretty=True)

    def to_sha256sum(self) -> str:
        return "".join(f"{e.sha256}  {e.path}\n" for e in self.entries)


def root_digest(entries: Iterable[Entry]) -> str:
    canonical = [e.model_dump() for e in sorted(entries, key=lambda e: e.path)]
    return hashlib.sha256(canonical_json(canonical, ensure_ascii=True).encode()).hexdigest()


def glob_regex(pattern: str) -> re.Pattern[str]:
    """Regex of a relative glob: `**/` any number of folders, `*` and `?` within one name, `[...]` classes."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and "]" in pattern[i + 2 :]:
            j = pattern.index("]", i + 2)
            body = pattern[i + 1 : j].replace("\\", "\\\\")
            out.append("[^" + body[1:] + "]" if body.startswith("!") else "[" + body + "]")
            i = j + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _walk(root: Path) -> list[tuple[str, bool, bool]]:
    """(relative POSIX path, is_symlink, is_regular_file) of every non-folder under root.

    Symlinked folders are listed, not entered; the file types come from the directory entries (no stat per file).
    An orch home (runs/, ledger/, scratch/: the default ./.orch of a project whose root is `.`) is never a source.
    """
    found: list[tuple[str, bool, bool]] = []
    stack = [(str(root), "")]
    while stack:
        path, prefix = stack.pop()
        with os.scandir(path) as it:
            for entry in it:
                rel = prefix + entry.name
                if entry.is_symlink():
                    found.append((rel, True, False))
                elif entry.is_dir(follow_symlinks=False):
                    if not is_home(Path(entry.path)):
                        stack.append((entry.path, rel + "/"))
                else:
                    found.append((rel, False, entry.is_file(follow_symlinks=False)))
    return found


def select_files(root: Path, include: Sequence[str]) -> list[str]:
    """Sorted relative POSIX paths of the regular files under root matched by the include globs.

    Refuses (exit 3) an include that matches nothing and a symlink that leaves the root.
    """
    if not root.is_dir():
        raise RefusedError(f"{root}: not a directory; give the root of the sources")
    real_root = root.resolve()
    for pattern in include:
        if pattern.startswith("/") or ".." in pattern.split("/"):
            raise RefusedError(f"include {pattern!r} leaves the root; use a glob relative to {root}")
    regexes = [(pattern, glob_regex(pattern)) for pattern in include]
    matched = dict.fromkeys(include, False)
    selected: list[str] = []
    for rel, is_link, is_file in _walk(root):
        hits = [pattern for pattern, rx in regexes if rx.match(rel)]
        if not hits:
            continue
        if is_link:
            target = (root / rel).resolve()
            if not target.is_relative_to(real_root):
                raise RefusedError(f"{rel}: symlink leaves the root ({target}); replace it with a file")
            if not target.is_file():
                continue
        elif not is_file:
            continue  # sockets, FIFOs and devices are not sources
        for pattern in hits:
            matched[pattern] = True
        selected.append(rel)
    for pattern, hit in matched.items():
        if not hit:
            raise RefusedError(f"include {pattern!r} matches no file under {root}; fix the glob")
    return sorted(selected)


def _hash_one(root: str, rel: str) -> Entry:
    try:
        digest, size = file_sha256(os.path.join(root, rel))
    except PermissionError:
        raise RefusedError(f"{rel}: unreadable (permission denied); fix its permissions") from None
    except OSError as err:
        raise RefusedError(f"{rel}: cannot be read ({err.strerror}); fix or exclude it") from None
    return Entry.model_construct(path=rel, sha256=digest, size=size)


def _hash_in_children(root: str, files: list[str], workers: int) -> list[Entry]:
    """Hash files[i::workers] in forked children (i >= 1) and files[0::workers] here; results come through pipes."""
    children = []
    for i in range(1, workers):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: hash its share, write JSON lines, leave without running any cleanup of the parent
            code = 1  # whatever goes wrong here, the child never returns into the parent's code
            try:
                os.close(r)
                try:
                    lines = []
                    for rel in files[i::workers]:
                        e = _hash_one(root, rel)
                        lines.append(json.dumps([e.path, e.sha256, e.size]))
                    payload, code = ("\n".join(lines)).encode(), 0
                except RefusedError as err:
                    payload = json.dumps({"error": err.message}).encode()
                with os.fdopen(w, "wb") as out:
                    out.write(payload)
            finally:
                os._exit(code)
        os.close(w)
        children.append((pid, r))
    errors: list[str] = []
    try:
        entries = [_hash_one(root, rel) for rel in files[0::workers]]
    except RefusedError as err:  # every child is still read and reaped: none is left behind as a zombie
        entries, errors = [], [err.message]
    for pid, r in children:
        with os.fdopen(r, "rb") as f:
            data = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            errors.append(json.loads(data)["error"] if data.startswith("{") else "a hashing process failed")
            continue
        for line in data.splitlines():
            p, d, n = json.loads(line)
            entries.append(Entry.model_construct(path=p, sha256=d, size=n))
    if errors:
        raise RefusedError(errors[0])  # the first share's (the parent's, then each child's in order)
    return sorted(entries, key=lambda e: e.path)


def hash_tree(root: Path, include: Sequence[str], workers: int | None = None) -> Manifest:
    """Manifest of the files under root selected by include; many files are hashed on every core."""
    files = select_files(root, include)
    workers = (os.cpu_count() or 1) if workers is None else workers
    if len(files) < _PARALLEL_MIN_FILES or workers <= 1:
        entries = [_hash_one(str(root), rel) for rel in files]
    else:
        # forked processes, not threads: small files are bound by per-file Python work that holds the GIL
        entries = _hash_in_children(str(root), files, workers)
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
