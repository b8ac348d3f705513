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

from protocol.errors import FailedError
from protocol.fileio import write_atomic
from protocol.hashing import canonical_json, sha256_file
from protocol.run_record import CacheUse, TunedKernel

CACHE_VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
TUNED_SUFFIXES = (".best_config", ".autotune.json")  # Inductor's benchmarked picks; Triton's autotuner (cached)
TIMING_KEYS = frozenset({"time_taken_ms", "triton_cache_hash", "timings", "configs_timings"})  # not the pick itself
MANIFEST = "compile-cache.baseline.json"  # in the run directory: the sealed baseline cache, file by file
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
    """Every regular file under `folder` (relative path -> sha256); lock files and temporaries of a writer left out."""
    out: dict[str, str] = {}
    if not folder.is_dir():
        return out
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if name.endswith(".lock") or name.startswith("tmp"):
                continue
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                out[str(path.relative_to(folder))] = sha256_file(path)
    return dict(sorted(out.items()))


def is_tuned(rel: str) -> bool:
    return rel.endswith(TUNED_SUFFIXES)


def tuned_pick(path: Path) -> object:
    """The configuration a tuned file records, without the timings that came with it (those differ run to run)."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return sha256_file(path) if path.is_file() else None
    if isinstance(doc, dict):
        return {k: v for k, v in doc.items() if k not in TIMING_KEYS}
    return doc


def kernel_name(folder: Path, rel: str) -> str:
    """The kernel a tuned file belongs to: Inductor's `<hash>.best_config` sits beside `<hash>.py`, whose @triton.jit
    function names it; Triton's autotuner names its file after the function; else the file's stem."""
    if rel.endswith(".autotune.json"):
        return Path(rel).name[: -len(".autotune.json")]
    source = folder / (rel[: -len(".best_config")] + ".py")
    try:
        text = source.read_text(errors="replace")
    except OSError:
        return Path(rel).stem
    found = _KERNEL_DEF.search(text) or _ANY_DEF.search(text)
    return found.group(1) if found else Path(rel).stem


def tuned_digest(folder: Path, files: Mapping[str, str]) -> str:
    """sha256 over every tuned pick in `files` (by path): equal digests mean the same kernel configurations."""
    picks = {rel: tuned_pick(folder / rel) for rel in files if is_tuned(rel)}
    return hashlib.sha256(canonical_json(picks, ensure_ascii=True).encode()).hexdigest()


def _show(pick: object) -> str:
    if isinstance(pick, dict):
        return ", ".join(f"{k} {v}" for k, v in sorted(pick.items()) if not isinstance(v, (dict, list)))[:160]
    return str(pick)[:64]


@dataclass
class RunCaches:
    """Where one run's compile caches live: `root` holds the baseline's (kept when the protocol declared it, else in
    the run's scratch), `work` the packages' working copies (always scratch, deleted with it)."""

    root: Path
    work: Path
    baseline: Path
    manifest_path: Path
    sealed: dict[str, str] | None = None  # the baseline cache's files once the prime package has passed

    @classmethod
    def for_run(cls, env: Mapping[str, str], scratch: Path, run_dir: Path, baseline_root: str,
                run_id: str) -> RunCaches:
        declared = _declared_root(env)
        root = declared if declared is not None else scratch / "compile-cache"
        work = scratch / "compile-cache" / "packages"
        return cls(root, work, root / f"baseline-{baseline_root[:16]}-{run_id}", run_dir / MANIFEST)

    def folder(self, package: str, kind: str) -> Path:
        """The folder a package compiles into: the baseline's own for prime, else its private working copy."""
        return self.baseline if kind == "prime" else self.work / package

    @staticmethod
    def env(folder: Path) -> dict[str, str]:
        return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}

    def prepare(self, package: str, kind: str) -> Path:
        """Make the package's folder: prime's empty baseline folder, else a copy of the sealed baseline (empty before
        the prime, i.e. for checks). A copy, never a link: a write through a link would change the baseline's file."""
        folder = self.folder(package, kind)
        if kind == "prime":  # named by the run id: only an earlier attempt of this very run can have left one
            if folder.exists():
                _make_writable(folder)
                shutil.rmtree(folder)
            folder.mkdir(parents=True)
        else:
            if folder.exists():
                _make_writable(folder)
                shutil.rmtree(folder)
            if self.sealed is not None:
                shutil.copytree(self.baseline, folder, symlinks=True, copy_function=shutil.copy2)
                _make_writable(folder)
            else:
                folder.mkdir(parents=True)
        for sub in ("inductor", "triton"):
            (folder / sub).mkdir(exist_ok=True)
        return folder

    def seal_baseline(self) -> CacheUse:
        """After the prime passed: its files become the baseline cache, read-only, listed in the run directory."""
        files = inventory(self.baseline)
        write_atomic(self.manifest_path, (canonical_json({"schema": "orch.compile-cache/1", "files": files},
                                                         ensure_ascii=True, pretty=True) + "\n").encode())
        for dirpath, _dirs, names in os.walk(self.baseline):
            for name in names:
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink():
                    path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        self.sealed = files
        tuned = [rel for rel in files if is_tuned(rel)]
        return CacheUse(baseline_files=len(files), baseline_tuned=len(tuned), taken=0, taken_tuned=0,
                        made=len(files), made_tuned=len(tuned), changed=0, baseline_tuned_sha256=tuned_digest(
                            self.baseline, files), tuned_sha256=tuned_digest(self.baseline, files), own_kernels=[])

    def check_baseline(self, after: str) -> None:
        """The sealed baseline cache is unchanged (no package may write it): FailedError naming what changed."""
        if self.sealed is None:
            return
        now = inventory(self.baseline)
        changed = sorted(rel for rel in set(now) | set(self.sealed) if now.get(rel) != self.sealed.get(rel))
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise FailedError(
                f"the baseline's compile cache changed during {after}: {len(changed)} file(s) ({shown}); it is "
                "sealed after the prime package and every arm loads it: a package may write only its own copy")

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
                kernel=name, file=rel, pick=_show(tuned_pick(folder / rel)),
                baseline_pick=None if theirs is None else _show(tuned_pick(self.baseline / theirs)),
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
        if folder.exists():
            _make_writable(folder)
            shutil.rmtree(folder, ignore_errors=True)


def _make_writable(folder: Path) -> None:
    for dirpath, dirs, names in os.walk(folder):
        for name in [*dirs, *names]:
            path = Path(dirpath) / name
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
