"""The run's compile caches: the baseline's, filled once by the untimed `prime` package and sealed, and a working copy
of it for every later package; what each package took from it, made itself, and which tuned kernels it ran.

Inductor and Triton pick kernel configurations by timing them on first use and keep the pick in the cache
(`*.best_config`, Triton's `*.autotune.json`); two cold compiles of the same code may pick differently and so sum in
another order. Every arm starts from the same primed picks, so an identical candidate is bit for bit the baseline.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.isolation.safe_paths import (
    UnsafeEntry,
    chmod_tree_read_only,
    fingerprint_changes,
    open_dir,
    open_dir_at,
    open_regular,
    opened_dir,
    read_at,
    walk,
)
from protocol.errors import FailedError
from protocol.fileio import NotRegularError, write_atomic
from protocol.hashing import canonical_json, sha256_fd
from protocol.run_record import CacheUse, TunedKernel

CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
TUNED_SUFFIXES = (".best_config", ".autotune.json")  # Inductor's benchmarked picks; Triton's autotuner (cached)
TIMING_KEYS = frozenset({"time_taken_ms", "triton_cache_hash", "timings", "configs_timings"})  # not the pick itself
MANIFEST = "compile-cache.baseline.json"  # in the run directory: the sealed baseline cache, entry by entry
MANIFEST_SCHEMA = "orch.compile-cache/2"
PICK_LIMIT = 1 << 20  # a tuned pick is a small JSON; a larger file is read this far (never a FIFO, never a link)
SOURCE_LIMIT = 4 << 20
_KERNEL_DEF = re.compile(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def\s+(\w+)\s*\(")
_ANY_DEF = re.compile(r"^def\s+(\w+)\s*\(", re.MULTILINE)


def _declared_root(env: Mapping[str, str]) -> Path | None:
    """A cache folder the protocol's launcher environment names: the run's caches are made inside it."""
    for var in CACHE_VARS:
        value = env.get(var)
        if value and os.path.isabs(value):
            return Path(value)
    return None


def inventory(folder: Path) -> dict[str, str]:
    """What a package's folder holds, for the accounting of taken, made and changed files: every regular file
    (relative path -> sha256), lock files and a writer's temporaries left out. Nothing is followed
    (orchestrator/isolation/safe_paths.py); the seal itself is seal_entries."""
    return {rel: value for rel, value in seal_entries(folder).items()
            if value not in FOLDER_OR_SPECIAL and not _accounting_skips(rel)}


FOLDER = "folder"
FOLDER_OR_SPECIAL = frozenset({FOLDER, "link", "FIFO", "socket", "character device", "block device", "special file"})


def _accounting_skips(rel: str) -> bool:
    name = rel.rpartition("/")[2]
    return name.endswith(".lock") or name.startswith("tmp")


def seal_entries(folder: Path) -> dict[str, str]:
    """Every entry under `folder`, whatever its name (relative path -> the sha256 of a regular file, 'folder', or
    the kind of a link or special file): what Inductor's and Triton's lookups can load, lock files and temporaries
    included (Inductor unpickles every file of a key folder whose name does not start with '.'). Never followed."""
    out: dict[str, str] = {}
    try:
        root = open_dir(folder)
    except FileNotFoundError:
        return out
    try:
        for entry in walk(root):
            if entry.kind != "file":
                out[entry.rel] = FOLDER if entry.kind == "folder" else entry.kind
                continue
            parent, _, name = entry.rel.rpartition("/")
            with opened_dir(folder, parent) as dfd:
                try:
                    fd = open_regular(dfd, name, entry.rel)
                except NotRegularError as err:
                    out[entry.rel] = "link" if "link" in (err.strerror or "") else "special file"
                    continue
                except FileNotFoundError:
                    continue
                try:
                    out[entry.rel] = sha256_fd(fd)[0]
                finally:
                    os.close(fd)
    finally:
        os.close(root)
    return dict(sorted(out.items()))


def _entry_changes(sealed: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    return fingerprint_changes(sealed, now, lambda v: v if v in FOLDER_OR_SPECIAL else None)


def _shown(changed: list[str]) -> str:
    return ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")


def is_tuned(rel: str) -> bool:
    return rel.endswith(TUNED_SUFFIXES)


def tuned_pick(folder: Path, rel: str) -> object:
    """The configuration a tuned file records, without the timings that came with it (those differ run to run)."""
    try:
        raw = read_at(folder, rel, PICK_LIMIT)
    except (OSError, UnsafeEntry):
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return hashlib.sha256(raw).hexdigest()
    if isinstance(doc, dict):
        return {k: v for k, v in doc.items() if k not in TIMING_KEYS}
    return doc


def kernel_name(folder: Path, rel: str) -> str:
    """The kernel a tuned file belongs to: Inductor's `<hash>.best_config` sits beside `<hash>.py`, whose @triton.jit
    function names it; Triton's autotuner names its file after the function; else the file's stem."""
    if rel.endswith(".autotune.json"):
        return Path(rel).name[: -len(".autotune.json")]
    try:
        text = read_at(folder, rel[: -len(".best_config")] + ".py", SOURCE_LIMIT).decode(errors="replace")
    except (OSError, UnsafeEntry):
        return Path(rel).stem
    found = _KERNEL_DEF.search(text) or _ANY_DEF.search(text)
    return found.group(1) if found else Path(rel).stem


def tuned_digest(folder: Path, files: Mapping[str, str]) -> str:
    """sha256 over every tuned pick in `files` (by path): equal digests mean the same kernel configurations."""
    picks = {rel: tuned_pick(folder, rel) for rel in files if is_tuned(rel)}
    return hashlib.sha256(canonical_json(picks, ensure_ascii=True).encode()).hexdigest()


def _show(pick: object) -> str:
    if isinstance(pick, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(pick.items()) if not isinstance(v, (dict, list)))[:160]
    return str(pick)[:64]


@dataclass
class RunCaches:
    """Where one run's compile caches live: `root` holds the baseline's, kept after the run (the protocol's cache
    folder, else the orch home's compile-cache/: orchestrator/isolation/kept_cache.py), `work` the packages' working
    copies (always scratch, deleted with it)."""

    root: Path
    work: Path
    baseline: Path
    manifest_path: Path
    sealed: dict[str, str] | None = None  # the baseline cache's files once the prime package has passed (accounting)
    seal: dict[str, str] | None = None  # every entry of the sealed baseline cache (seal_entries): what is checked
    manifest: bytes | None = None  # the manifest's bytes once sealed (or adopted from a kept cache)

    @classmethod
    def for_run(cls, env: Mapping[str, str], scratch: Path, run_dir: Path, key: str, run_id: str,
                kept_root: Path | None = None) -> RunCaches:
        """The prime fills `baseline-KEY16-RUN_ID` (`key`: the kept key, orchestrator/isolation/kept_cache.py) under the
        protocol's cache folder, else under `kept_root` (the orch home's; None: the run's scratch, not kept)."""
        declared = _declared_root(env)
        root = declared if declared is not None else kept_root if kept_root is not None else scratch / "compile-cache"
        work = scratch / "compile-cache" / "packages"
        return cls(root, work, root / f"baseline-{key[:16]}-{run_id}", run_dir / MANIFEST)

    def adopt(self, name: str, entries: dict[str, str], manifest: bytes) -> None:
        """Load a kept cache, already checked entry for entry (kept_cache.check), instead of priming: from now on it
        is the sealed baseline cache, checked before and after every package; its manifest goes into the run."""
        self.baseline = self.root / name
        self.seal = dict(entries)
        self.sealed = {rel: v for rel, v in entries.items() if v != FOLDER and not _accounting_skips(rel)}
        self.manifest = manifest
        write_atomic(self.manifest_path, manifest)

    def discard_prime(self) -> None:
        """A prime that failed leaves no cache behind (nothing kept was sealed)."""
        if self.seal is None and (self.baseline.exists() or self.baseline.is_symlink()):
            _remove(self.baseline)

    def folder(self, package: str, kind: str) -> Path:
        """The folder a package compiles into: the baseline's own for prime, else its private working copy."""
        return self.baseline if kind == "prime" else self.work / package

    @staticmethod
    def env(folder: Path) -> dict[str, str]:
        return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}

    def prepare(self, package: str, kind: str) -> Path:
        """Make the package's folder: prime's empty baseline folder, else a copy of the sealed baseline (empty before
        the prime, i.e. for checks). A copy, never a link: a write through a link would change the baseline's file;
        copied through descriptors, entry by entry as sealed (check_copy compares it again just before it starts)."""
        folder = self.folder(package, kind)
        if folder.exists() or folder.is_symlink():  # prime: only an earlier attempt of this very run can have left one
            _remove(folder)
        folder.mkdir(parents=True)
        if kind != "prime" and self.sealed is not None:
            _copy_sealed(self.baseline, folder, self.seal)
        for sub in ("inductor", "triton"):
            (folder / sub).mkdir(exist_ok=True)
        return folder

    def seal_baseline(self, prime_steps: int | None = None, launch_steps: int | None = None) -> CacheUse:
        """After the prime passed: every entry it left becomes the baseline cache, read-only (files and folders),
        listed in the run directory; a link or special file fails the prime, named (the lookups would follow it)."""
        entries = seal_entries(self.baseline)
        odd = [f"{rel} ({kind})" for rel, kind in entries.items() if kind in FOLDER_OR_SPECIAL and kind != FOLDER]
        if odd:
            raise FailedError(f"the prime left {len(odd)} link(s) or special file(s) in the baseline's compile cache: "
                              f"{_shown(odd)}; Inductor and Triton would follow them, so a sealed cache holds only "
                              "files and folders")
        files = {rel: v for rel, v in entries.items() if v != FOLDER}
        folders = sorted(rel for rel, v in entries.items() if v == FOLDER)
        data = (canonical_json({"schema": MANIFEST_SCHEMA, "files": files, "folders": folders}, ensure_ascii=True,
                               pretty=True) + "\n").encode()
        write_atomic(self.manifest_path, data)
        with opened_dir(self.baseline) as fd:
            chmod_tree_read_only(fd)
        self.seal = entries
        self.manifest = data
        self.sealed = {rel: v for rel, v in files.items() if not _accounting_skips(rel)}
        tuned = [rel for rel in self.sealed if is_tuned(rel)]
        digest = tuned_digest(self.baseline, self.sealed)
        return CacheUse(baseline_files=len(self.sealed), baseline_tuned=len(tuned), taken=0, taken_tuned=0,
                        made=len(self.sealed), made_tuned=len(tuned), changed=0, baseline_tuned_sha256=digest,
                        tuned_sha256=digest, own_kernels=[], sealed_entries=len(entries),
                        manifest_sha256=hashlib.sha256(data).hexdigest(), prime_steps=prime_steps,
                        launch_steps=launch_steps)

    def check_baseline(self, when: str) -> None:
        """The sealed baseline cache is entry for entry as sealed (no package may write it): FailedError naming what
        changed, was added (a link or a special file named as such) or removed."""
        if self.seal is None:
            return
        changed = _entry_changes(self.seal, seal_entries(self.baseline))
        if changed:
            raise FailedError(
                f"the baseline's compile cache changed {when}: {len(changed)} entr{'y' if len(changed) == 1 else 'ies'}"
                f" ({_shown(changed)}); it is sealed after the prime package and every arm loads it: a package may "
                "write only its own copy")

    def check_copy(self, folder: Path) -> None:
        """A package's fresh copy is the seal, entry for entry, just before the package starts (the two folders
        orch adds to an empty one aside): FailedError naming the difference."""
        if self.seal is None:
            return
        now = seal_entries(folder)
        expected = {**self.seal, **{sub: FOLDER for sub in ("inductor", "triton")}}
        changed = _entry_changes(expected, now)
        if changed:
            raise FailedError(f"the copy of the baseline's compile cache for {folder.name} is not the sealed cache: "
                              f"{_shown(changed)}; something wrote it after orch made it")

    def check_compiled_nothing(self, package: str) -> None:
        """measurement.compile: none: the package's cache folder is still empty, else FailedError naming what it
        compiled or tuned (cold compiles in every arm can pick different kernels, so such a trainer needs the prime)."""
        made = list(inventory(self.work / package))
        if made:
            tuned = sum(is_tuned(rel) for rel in made)
            shown = ", ".join(made[:3]) + (f" and {len(made) - 3} more" if len(made) > 3 else "")
            raise FailedError(
                f"{package} compiled {len(made)} file(s) into its compile cache ({tuned} tuned pick(s): {shown}) but "
                "the protocol says measurement.compile: none; a trainer that compiles needs the prime, so that every "
                "arm runs the same tuned kernels: set measurement.compile: prime (the default)")

    def use(self, package: str, kind: str) -> CacheUse | None:
        """What a package's folder holds after it ran, against the sealed baseline: taken (equal files), made (new),
        changed (rewritten), the digest of every tuned pick it ran with, and the kernels it tuned itself."""
        if kind == "prime" or self.sealed is None:
            return None
        folder = self.folder(package, kind)
        files = inventory(folder)
        base = self.sealed
        taken = [rel for rel, digest in files.items() if base.get(rel) == digest]
        made = [rel for rel in files if rel not in base]
        changed = [rel for rel in files if rel in base and base[rel] != files[rel]]
        base_names = {kernel_name(self.baseline, rel): rel for rel in base if is_tuned(rel)}
        own = []
        for rel in sorted(made + changed):
            if not is_tuned(rel):
                continue
            name = kernel_name(folder, rel)
            theirs = base_names.get(name) if rel in made else rel
            own.append(TunedKernel(
                kernel=name, file=rel, pick=_show(tuned_pick(folder, rel)),
                baseline_pick=None if theirs is None else _show(tuned_pick(self.baseline, theirs)),
                rewritten=rel in changed))
        shared = {rel: files[rel] for rel in files if rel in base}
        return CacheUse(
            baseline_files=len(base), baseline_tuned=sum(is_tuned(r) for r in base), taken=len(taken),
            taken_tuned=sum(is_tuned(r) for r in taken), made=len(made), made_tuned=sum(is_tuned(r) for r in made),
            changed=len(changed), baseline_tuned_sha256=tuned_digest(folder, shared),
            tuned_sha256=tuned_digest(folder, files), own_kernels=own[:50])

    def remove_work(self, package: str, kind: str) -> None:
        """A package's working copy is not kept once it is recorded (the baseline's stays until the scratch goes)."""
        if kind == "prime":
            return
        folder = self.folder(package, kind)
        if folder.exists() or folder.is_symlink():
            _remove(folder)


def _remove(folder: Path) -> None:
    """Delete a folder a package could have written: its folders made writable through descriptors (no link
    followed), then shutil.rmtree, which removes links as links and never follows them."""
    if folder.is_symlink() or not folder.is_dir():
        folder.unlink()
        return
    with opened_dir(folder) as fd:
        _writable_folders(fd)
    shutil.rmtree(folder)


def _writable_folders(dir_fd: int) -> None:
    os.fchmod(dir_fd, stat.S_IMODE(os.fstat(dir_fd).st_mode) | stat.S_IRWXU)
    for name in os.listdir(dir_fd):
        try:
            sub = open_dir_at(dir_fd, name)
        except (UnsafeEntry, FileNotFoundError, NotADirectoryError):
            continue
        try:
            _writable_folders(sub)
        finally:
            os.close(sub)


def _copy_sealed(src: Path, dest: Path, seal: Mapping[str, str] | None) -> None:
    """Copy the sealed baseline into an empty folder through descriptors: folders made, regular files copied,
    anything else (which the seal refused) is an error, never copied as a link."""
    with opened_dir(src) as sfd, opened_dir(dest) as dfd:
        for entry in walk(sfd):
            if entry.kind == "folder":
                os.mkdir(entry.rel, 0o755, dir_fd=dfd)
                continue
            if entry.kind != "file":
                raise FailedError(f"the baseline's compile cache holds a {entry.kind} at {entry.rel}: not sealed "
                                  "by orch; a package's copy never takes one")
            parent, _, name = entry.rel.rpartition("/")
            with opened_dir(src, parent) as sp, opened_dir(dest, parent) as dp:
                fd = open_regular(sp, name, entry.rel)
                try:
                    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                                  dir_fd=dp)
                    try:
                        while chunk := os.read(fd, 1 << 20):
                            os.write(out, chunk)
                        os.utime(out, ns=(entry.mtime_ns, entry.mtime_ns))  # as copy2 did: mtimes kept
                    finally:
                        os.close(out)
                finally:
                    os.close(fd)
