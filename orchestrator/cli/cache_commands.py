"""`orch cache ls` and `orch cache rm`: the kept baseline compile caches of an orch home (or of a protocol's cache
folder), each checked as a run would check it before loading it (orchestrator/isolation/kept_cache.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ledger.cost.store import Ledger
from orchestrator.isolation.compile_cache import _remove
from orchestrator.isolation.kept_cache import (
    KEPT_DIR,
    MANIFEST_SUFFIX,
    RECORD_SUFFIX,
    check,
    is_kept_name,
    records,
    size_bytes,
)
from protocol.errors import UsageError
from protocol.home import resolve_home


def _root(home: Path | None, folder: Path | None) -> tuple[Path, Ledger]:
    h = resolve_home(home)
    return (folder.expanduser().resolve() if folder is not None else h.root / KEPT_DIR), Ledger(h.ledger_path)


def ls_command(home: Path | None, folder: Path | None) -> dict[str, Any]:
    """Every kept cache (newest first) with what a run would find when it checks it; folders of a prime that was
    never kept (it failed, or ran before issue 51) are listed as such."""
    root, ledger = _root(home, folder)
    rows: list[dict[str, Any]] = []
    recorded = set()
    for name, rec, problem in records(root):
        recorded.add(name)
        row: dict[str, Any] = {"name": name, "size_bytes": size_bytes(root / name) if (root / name).is_dir() else 0}
        if rec is None:
            rows.append({**row, "status": problem})
            continue
        _entries, why = check(root, rec, ledger) if problem is None else (None, problem)
        rows.append({**row, "key": rec.key, "sealed_by": rec.sealed_by, "sealed_at": rec.sealed_at,
                     "entries": rec.entries, "tuned": rec.tuned, "prime_steps": rec.prime_steps,
                     "prime_gpu_seconds": rec.prime_gpu_seconds, "status": "ok" if why is None else why})
    try:
        loose = sorted(n for n in os.listdir(root) if is_kept_name(n) and n not in recorded and (root / n).is_dir())
    except FileNotFoundError:
        loose = []
    rows += [{"name": n, "size_bytes": size_bytes(root / n), "status": "not kept (no record: its prime failed or ran "
              "before caches were kept); `orch cache rm` frees it"} for n in loose]
    if not rows:
        print(f"no kept compile cache under {root}")
    for row in rows:
        figures = (f"sealed by {row['sealed_by']} at {row['sealed_at']}, {row['entries']} entries, {row['tuned']} "
                   f"tuned, prime {row['prime_steps']} step(s) {row['prime_gpu_seconds'] or 0:.1f} GPU-s; "
                   if "sealed_by" in row else "")
        print(f"{row['name']}: {figures}{row['size_bytes'] / 2**20:.1f} MiB; {row['status']}")
    return {"root": str(root), "caches": rows}


def rm_command(home: Path | None, folder: Path | None, names: list[str], everything: bool) -> dict[str, Any]:
    """Remove kept caches by name (or all of them): the folder, its manifest copy and its record. The ledger and the
    sealing run's evidence stay; a later run of that key primes again."""
    root, _ = _root(home, folder)
    known = sorted({n for n, _, _ in records(root)} | {n for n in (os.listdir(root) if root.is_dir() else [])
                                                        if is_kept_name(n) and (root / n).is_dir()})
    if everything == bool(names):
        raise UsageError("give the names of kept caches (`orch cache ls` lists them) or --all, not both")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"no kept compile cache {unknown[0]} under {root}; `orch cache ls` lists them")
    removed = []
    for name in known if everything else names:
        if (root / name).is_dir() or (root / name).is_symlink():
            _remove(root / name)
        for suffix in (RECORD_SUFFIX, MANIFEST_SUFFIX):  # the record first: a half-removed cache is never loaded
            (root / f"{name}{suffix}").unlink(missing_ok=True)
        removed.append(name)
        print(f"removed {name}")
    return {"root": str(root), "removed": removed}
