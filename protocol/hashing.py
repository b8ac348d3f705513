"""The one canonical JSON and the one file hash of the project: every hashed document's bytes come from here.

Callers state `ensure_ascii` (and `allow_nan` where NaN must be refused): the bytes each document had are kept.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20


def canonical_json(doc: Any, *, ensure_ascii: bool, allow_nan: bool = True, pretty: bool = False) -> str:
    """Sorted keys; compact (no whitespace), or with `pretty` one-space indents and a final newline.

    ensure_ascii=False keeps non-ASCII text as UTF-8 (protocol ids, ledger records, audit.json); True escapes it
    (manifest roots, run.json, package.json). allow_nan=False refuses NaN and infinities (ledger records).
    """
    if pretty:
        return json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=ensure_ascii, allow_nan=allow_nan) + "\n"
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=allow_nan)


def sha256_fd(fd: int) -> tuple[str, int]:
    """(SHA256 hex, size in bytes) of an open file, read from its start in 1 MiB chunks by offset (pread): the
    descriptor's own position is left where it was, so another reader of the same descriptor is not disturbed."""
    h = hashlib.sha256()
    size = 0
    while chunk := os.pread(fd, _CHUNK, size):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def file_sha256(path: Path | str) -> tuple[str, int]:
    """SHA256 (hex) of a file's raw bytes and its size in bytes, read in 1 MiB chunks."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return sha256_fd(fd)
    finally:
        os.close(fd)


def sha256_file(path: Path | str) -> str:
    """SHA256 (hex) of a file's raw bytes."""
    return file_sha256(path)[0]
