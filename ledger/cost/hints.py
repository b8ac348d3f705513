"""The ledger's caches beside its file: the tail hint (where the last record starts, how many were ever appended) and
the offset index. Both are only hints: checked against the bytes before they are used, never trusted.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any


def read_tail_hint(tail_path: Path) -> dict[str, Any] | None:
    try:
        hint = json.loads(tail_path.read_text())
    except (OSError, ValueError):
        return None
    return hint if isinstance(hint, dict) else None


def write_tail_hint(tail_path: Path, size: int, offset: int, records: int) -> None:
    """A cache of where the last record starts (and how many records were ever appended); never trusted."""
    tmp = tail_path.with_name(tail_path.name + f".{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"size": size, "offset": offset, "records": records}))
        os.replace(tmp, tail_path)
    except OSError:  # e.g. a full disk: a cache, so the append stands; no temporary file is left
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def extend_index(index_path: Path, seq: int, offset: int) -> None:
    """Add the new message's offset to the index when it holds exactly the earlier ones, else drop it."""
    with contextlib.suppress(OSError):
        try:
            entries = index_path.stat().st_size // 8
        except FileNotFoundError:
            entries = 0 if seq == 0 else -1
        if entries != seq:
            index_path.unlink(missing_ok=True)
            return
        fd = os.open(index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, int(offset).to_bytes(8, "little"))
        finally:
            os.close(fd)
