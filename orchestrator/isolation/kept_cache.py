"""The kept baseline compile caches (issue 51): a cache the prime sealed stays in the orch home (or the protocol's
cache folder) under a key of everything that decides what the baseline compiles, and a later run or A/A launch of the
same key loads it instead of priming, once every entry is checked against the manifest its sealing run recorded.

Beside each kept folder `baseline-KEY16-RUN_ID/`: `baseline-KEY16-RUN_ID.manifest.json` (the sealing run's
compile-cache.baseline.json, byte for byte; its sha256 is in that run's ledger record of the prime) and
`baseline-KEY16-RUN_ID.kept.json` (the key, its fields, who sealed it and when). Nothing here is trusted: the
manifest's sha256 must be the ledger's, and the folder must list exactly the manifest's entries, files hashed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ledger.cost.store import Ledger
from orchestrator.isolation.compile_cache import FOLDER, seal_entries
from protocol.fileio import read_regular, write_atomic
from protocol.hashing import canonical_json
from protocol.run_record import HostFingerprint, KeptCache
from protocol.schema import LoadedProtocol

KEPT_SCHEMA = "orch.kept-cache/1"
KEPT_DIR = "compile-cache"  # under the orch home, when the protocol declares no cache folder
MANIFEST_SUFFIX = ".manifest.json"
RECORD_SUFFIX = ".kept.json"
# the prime's ledger note: the manifest's sha256, which a later run checks a kept cache against
SEALED_NOTE = "compile cache sealed: {entries} entries, manifest sha256 {sha}"
_SEALED = re.compile(r"manifest sha256 ([0-9a-f]{64})")
_NAME = re.compile(r"^baseline-[0-9a-f]{16}-[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class KeptRecord(BaseModel):
    """`baseline-KEY16-RUN_ID.kept.json`: what a kept cache is kept for, and who sealed it."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_: Literal["orch.kept-cache/1"] = Field("orch.kept-cache/1", alias="schema")
    key: str
    fields: dict[str, Any]
    name: str
    sealed_by: str
    sealed_at: str
    manifest_sha256: str
    entries: int
    files: int
    tuned: int
    tuned_sha256: str
    prime_steps: int | None
    launch_steps: int | None
    prime_gpu_seconds: float | None

    def as_run_record(self, reused: bool, reason: str | None = None, checked_s: float | None = None) -> KeptCache:
        keep = self.model_dump(exclude={"schema_", "fields"})
        return KeptCache(**keep, reused=reused, reason=reason, checked_s=checked_s)


def _normalised(values: Sequence[str], protocol_dir: Path, ports: set[str]) -> list[str]:
    """Values that name where a protocol's own files lie or which loopback port its judge listens on decide nothing a
    compiler sees: a rehearsal's derived protocol (a fresh folder, fresh ports) keeps one key from run to run. A
    baseline launch that still compiles is named by the audit (`unprimed`) and keeps the run from being accepted."""
    prefix = str(protocol_dir) + os.sep
    out = []
    for value in values:
        value = value.replace(prefix, "{protocol_dir}/")
        out.append(",".join("{endpoint_port}" if part in ports else part for part in value.split(",")))
    return out


def key_fields(loaded: LoadedProtocol, argv: Sequence[str], sources_root: str, host: HostFingerprint) -> dict[str, Any]:
    """What decides the baseline's compiled and tuned kernels: its sources, the launcher's argv and environment, the
    software and GPU, the ranks and the protocol's compile settings (issue 51)."""
    p = loaded.protocol
    ports = {e.rpartition(":")[2] for e in p.launcher.endpoints}
    base = loaded.path.resolve().parent
    env = dict(sorted(p.launcher.env.items()))
    return {
        "baseline_sources_root": sources_root,
        "argv": _normalised(list(argv), base, ports),
        "env": dict(zip(env, _normalised(list(env.values()), base, ports), strict=True)),
        "switches": dict(sorted(p.arms.baseline.switches.items())),
        "launcher": {"device": p.launcher.device, "backend": p.launcher.backend, "scheduler": p.launcher.scheduler},
        "ranks": p.launcher.world_size,
        "precision": p.precision,
        "torch": host.torch, "triton": host.triton, "cuda": host.cuda, "driver": host.driver,
        "gpu_model": host.gpu_model, "python": host.python,
        "compile": {"mode": p.measurement.compile, "prime_steps": p.measurement.prime_steps,
                    "steps": p.measurement.steps},
    }


def cache_key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(fields), ensure_ascii=True).encode()).hexdigest()


def folder_name(key: str, run_id: str) -> str:
    return f"baseline-{key[:16]}-{run_id}"


def keep(root: Path, manifest: bytes, record: KeptRecord) -> None:
    """Write the manifest copy and the record beside the sealed folder (the record last: it makes the cache kept)."""
    write_atomic(root / f"{record.name}{MANIFEST_SUFFIX}", manifest)
    write_atomic(root / f"{record.name}{RECORD_SUFFIX}",
                 (canonical_json(record.model_dump(by_alias=True), ensure_ascii=True, pretty=True)).encode())


def records(root: Path) -> list[tuple[str, KeptRecord | None, str | None]]:
    """(name, record, why it cannot be read) of every kept record under `root`, newest sealed first."""
    out: list[tuple[str, KeptRecord | None, str | None]] = []
    try:
        names = sorted(n for n in os.listdir(root) if n.endswith(RECORD_SUFFIX))
    except FileNotFoundError:
        return out
    for file in names:
        name = file[: -len(RECORD_SUFFIX)]
        try:
            rec = KeptRecord.model_validate_json(read_regular(root / file))
        except (OSError, ValidationError, ValueError) as err:
            out.append((name, None, f"{file} unreadable ({type(err).__name__})"))
            continue
        out.append((name, rec, None if rec.name == name else f"{file} names another folder ({rec.name})"))
    out.sort(key=lambda x: (x[1].sealed_at if x[1] else "", x[0]), reverse=True)
    return out


def sealed_in_ledger(ledger: Ledger, run_id: str) -> str | None:
    """The manifest sha256 the ledger's passing prime of `run_id` recorded, or None."""
    for rec in reversed(ledger.records(run_id)):
        if rec.package == "prime" and rec.status == "ok" and rec.note and (m := _SEALED.search(rec.note)):
            return m.group(1)
    return None


def check(root: Path, rec: KeptRecord, ledger: Ledger) -> tuple[dict[str, str] | None, str | None]:
    """(every entry of the kept folder, None) when it is exactly what its sealing run recorded; else (None, why)."""
    where = f"kept cache {rec.name[:26]}"
    try:
        raw = read_regular(root / f"{rec.name}{MANIFEST_SUFFIX}")
    except OSError as err:
        return None, f"{where}: its manifest is unreadable ({err.strerror or type(err).__name__})"
    sha = hashlib.sha256(raw).hexdigest()
    if sha != rec.manifest_sha256:
        return None, f"{where}: its manifest's sha256 is not the one recorded when it was kept"
    if sealed_in_ledger(ledger, rec.sealed_by) != sha:
        return None, (f"{where}: the ledger holds no passing prime of run {rec.sealed_by} that recorded this manifest "
                      "(sealed under another home, or the ledger does not hold it)")
    try:
        doc = json.loads(raw)
        wanted = {**{str(k): str(v) for k, v in doc["files"].items()}, **{str(f): FOLDER for f in doc["folders"]}}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, f"{where}: its manifest is malformed"
    folder = root / rec.name
    if folder.is_symlink() or not folder.is_dir():
        return None, f"{where}: its folder is missing"
    now = seal_entries(folder)
    if now != wanted:
        diff = sorted(set(now) ^ set(wanted)) + sorted(r for r in set(now) & set(wanted) if now[r] != wanted[r])
        shown = ", ".join(diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")
        return None, f"{where}: {len(diff)} entr{'y' if len(diff) == 1 else 'ies'} not as sealed ({shown})"
    return now, None


def find(root: Path, key: str, ledger: Ledger) -> tuple[KeptRecord | None, dict[str, str] | None, str, float]:
    """The newest kept cache of `key` whose every entry checks, its entries, and what was said; else (None, None,
    why a fresh prime runs, seconds spent checking)."""
    t0 = time.monotonic()
    reasons = []
    for _name, rec, problem in records(root):
        if rec is None or rec.key != key:
            continue
        if problem is not None:
            reasons.append(problem)
            continue
        entries, why = check(root, rec, ledger)
        if entries is not None:
            return rec, entries, "", time.monotonic() - t0
        reasons.append(str(why))
    if not reasons:
        reasons.append(f"no kept compile cache of key {key[:16]} (the first run of this baseline, launcher, software "
                       "and GPU)")
    return None, None, "; ".join(reasons[:3]), time.monotonic() - t0


def size_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(folder):  # os.walk never follows links to folders
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def is_kept_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))
