"""`orch ledger repair`: a torn tail (an append cut short) moved aside, never deleted; damage inside is refused.

The caller holds the ledger's exclusive lock.
"""

from __future__ import annotations

import mmap
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ledger.cost.layout import CONTINUATION
from ledger.cost.scan import UNPARSEABLE, decode_message, message_length, scan_messages
from protocol.errors import FailedError
from protocol.fileio import fsync_dir


def repair_torn_tail(path: Path) -> Path | None:
    """Move a torn tail aside into `<ledger>.torn-<time>-<offset>` and cut it off; None if there is none.

    Refuses when a complete record follows the unparseable bytes: that is damage, not a torn append.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            scan = scan_messages(mm, size)
            if scan.end == size:
                return None
            later = _complete_message_after(mm, scan.end, size, scan.version)
            if later is not None:
                raise FailedError(
                    f"ledger {path.name}: bytes at offset {scan.end} do not parse but a complete "
                    f"record follows at offset {later}; this is damage inside the ledger, not a torn "
                    "tail; nothing was changed: restore the ledger from a copy"
                )
            torn = bytes(mm[scan.end : size])
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        aside = path.with_name(f"{path.name}.torn-{stamp}-{scan.end}")
        with open(aside, "xb") as f:
            f.write(torn)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(path.parent)
        os.ftruncate(fd, scan.end)
        os.fsync(fd)
    finally:
        os.close(fd)
    return aside


def _complete_message_after(buf: Any, start: int, size: int, version: int) -> int | None:
    """Offset of a decodable record message beginning after `start`, if any."""
    marker = CONTINUATION.to_bytes(4, "little")
    pos = bytes(buf[start:size]).find(marker, 1)
    while pos != -1:
        at = start + pos
        n = message_length(buf, at, size)
        if n is not None:
            try:
                decode_message(buf[at : at + n], version)
                return at
            except UNPARSEABLE:
                pass
        pos = bytes(buf[start:size]).find(marker, pos + 1)
    return None
