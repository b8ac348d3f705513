"""Witnessed heads: tree heads of the ledger kept outside the ledger file, checked before every audit.

A log is only as good as its witnessed heads (Certificate Transparency): the ledger must extend each of them.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import ledger.cost.merkle as merkle
from ledger.cost.merkle import TreeHead
from ledger.cost.salt import ledger_salt
from ledger.cost.store import Ledger
from protocol.errors import FailedError
from protocol.home import Home

WITNESS_SCHEMA = "orch.witness/1"
WITNESS_FILE = "heads.jsonl"
ENV_WITNESS = "ORCH_WITNESS"  # files (os.pathsep-separated) the user keeps out of the packages' reach
EVIDENCE_DIR = ("docs", "validation")


@dataclass(frozen=True)
class Witnessed:
    """One head seen earlier, and where it was recorded (file and line, or a published evidence file)."""

    head: TreeHead
    source: str
    by: str


def ledger_id(ledger: Ledger) -> str:
    """Names a ledger in witness files without revealing anything: SHA256 of its directory's random salt."""
    return hashlib.sha256(b"orch.ledger-id/1\0" + ledger_salt(ledger.path.parent).encode()).hexdigest()


def repository_root(start: Path) -> Path | None:
    """The repository enclosing `start`: its git work tree (a folder holding `.git`, a directory or a worktree's
    file), else, for a copy without `.git` (a device machine's), the nearest folder holding docs/validation/."""
    folders = (start.resolve(), *start.resolve().parents)
    for folder in folders:
        if (folder / ".git").exists():
            return folder
    return next((f for f in folders if f.joinpath(*EVIDENCE_DIR).is_dir()), None)


def witness_files(home: Home) -> list[Path]:
    """orch's own witness file in its home, then every file named by $ORCH_WITNESS."""
    named = [Path(p).expanduser() for p in os.environ.get(ENV_WITNESS, "").split(os.pathsep) if p.strip()]
    return [home.witness_dir / WITNESS_FILE, *named]


def record_head(home: Home, ledger: Ledger, by: str) -> TreeHead:
    """Append the ledger's current head to every witness file (one JSON line each, fsync'd)."""
    head = ledger.head()
    line = json.dumps({"schema": WITNESS_SCHEMA, "ledger": ledger_id(ledger), "size": head.size, "root": head.root,
                       "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": by}, sort_keys=True)
    for path in witness_files(home):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    return head


def _saw_run(by: str, run_id: str | None) -> bool:
    """Whether a witness line (`launch RUN`, `audit RUN`, `publish RUN TO`) was written for run `run_id`."""
    words = by.split()
    return run_id is not None and len(words) >= 2 and words[1] == run_id


def _replaced(where: str, run_id: str, other: str) -> FailedError:
    return FailedError(f"{where} saw run {run_id} in another ledger ({other[:12]}): the ledger that holds it was "
                       "replaced since; no audit: restore the ledger from a copy")


def _file_heads(path: Path, lid: str, own: bool, run_id: str | None = None) -> list[Witnessed]:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = text.split("\n")
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
            if doc.get("schema") != WITNESS_SCHEMA:
                raise ValueError("not an orch.witness/1 line")
            head = TreeHead(size=int(doc["size"]), root=str(doc["root"]))
            ledger = str(doc["ledger"])
        except (ValueError, KeyError, TypeError, AttributeError):
            if n == len(lines):
                continue  # a line torn by a crash while it was appended (no newline yet)
            raise FailedError(f"witness file {path}:{n} is not a witnessed head; no audit: restore the file "
                              "(witnessed heads are never edited)") from None
        if ledger != lid:
            if own:  # the home's own file witnesses only the home's ledger
                raise FailedError(f"witness file {path}:{n} holds a head of another ledger ({ledger[:12]}): this "
                                  "home's ledger was replaced since; no audit: restore the ledger from a copy")
            if _saw_run(str(doc.get("by", "")), run_id):  # a file shared by homes: this run was in another ledger
                raise _replaced(f"witness file {path}:{n}", str(run_id), ledger)
            continue
        out.append(Witnessed(head, f"{path}:{n}", str(doc.get("by", "?"))))
    return out


def _published_heads(repo: Path | None, lid: str, run_id: str | None = None) -> list[Witnessed]:
    """Heads in evidence that `orch publish` wrote for this ledger into the repository's docs/validation/."""
    if repo is None:
        return []
    out = []
    for path in sorted(repo.joinpath(*EVIDENCE_DIR).glob("*.json")):
        try:
            doc = json.loads(path.read_bytes())
            if not isinstance(doc, dict) or "ledger_id" not in doc:
                continue
            if doc["ledger_id"] != lid:
                if run_id is not None and doc.get("run_id") == run_id:
                    raise _replaced(str(path.relative_to(repo)), run_id, str(doc["ledger_id"]))
                continue
            head = TreeHead(size=int(doc["ledger_head"]["size"]), root=str(doc["ledger_head"]["root"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        out.append(Witnessed(head, str(path.relative_to(repo)), f"publish {doc.get('run_id')}"))
    return out


def witnessed_heads(home: Home, ledger: Ledger, repo: Path | None, run_id: str | None = None) -> list[Witnessed]:
    lid = ledger_id(ledger)
    files = witness_files(home)
    heads = [w for i, path in enumerate(files) for w in _file_heads(path, lid, own=i == 0, run_id=run_id)]
    return heads + _published_heads(repo, lid, run_id)


def check_witnessed(home: Home, ledger: Ledger, repo: Path | None, run_id: str | None = None) -> int:
    """FailedError (one line) unless the ledger extends every head witnessed for it; returns how many were checked.

    With `run_id` (an audit), a head witnessed for that run in another ledger (a witness file shared by several
    homes, published evidence) is refused too: the ledger was replaced, salt and all, since the run was seen.

    With every leaf at hand, the ledger extends head (s, r) exactly when the root of its first s leaves is r:
    one pass over the leaves gives every witnessed prefix root, and the largest head is also checked through
    the RFC 6962 consistency proof of `orch ledger verify --against`.
    """
    heads = witnessed_heads(home, ledger, repo, run_id)
    if not heads:
        return 0
    leaves = [merkle.leaf_hash(h) for h in ledger.record_hashes()]
    roots = merkle.prefix_roots(leaves, [w.head.size for w in heads if w.head.size <= len(leaves)])
    largest = max(heads, key=lambda w: w.head.size)
    bad = [w for w in heads if roots.get(w.head.size, b"").hex() != w.head.root]
    if not bad and not ledger.consistency(largest.head.size, largest.head.root):
        bad = [largest]
    if bad:
        w = min(bad, key=lambda w: w.head.size)
        raise FailedError(
            f"the ledger ({len(leaves)} records) is not an extension of head {w.head.size}:{w.head.root[:16]}... "
            f"witnessed in {w.source} ({w.by}): records were removed or rewritten since; no audit: restore the "
            "ledger from a copy"
        )
    return len(heads)
