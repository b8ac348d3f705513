"""Writing files so that a reader sees the old bytes or the new ones, never half: the one write_atomic of orch,
the directory fsync that makes a new file's name durable, and read_regular for files a package could have written.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from protocol.hashing import sha256_fd


def write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of it; a failed write leaves no temporary file."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class NotRegularError(OSError):
    """A path a package could write is a link, FIFO, socket or device where orch expects a regular file."""


def open_regular(path: Path) -> int:
    """A descriptor on a regular file a package could have written: the last component is never followed (a link is
    refused) and it is opened non-blocking and fstat-checked before a byte is read (a FIFO or a device is refused,
    never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise NotRegularError(errno.ELOOP, "a link, not a regular file", str(path)) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularError(errno.EINVAL, f"a {entry_kind(mode)}, not a regular file", str(path))
    return fd


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file that a package could have written (see open_regular). `limit`: read at most that
    many bytes."""
    fd = open_regular(path)
    try:
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read() if limit is None else fh.read(limit)
    finally:
        os.close(fd)


def regular_sha256(path: Path | str) -> str:
    """SHA256 (hex) of a regular file that a package could have written (see open_regular): a link, FIFO, socket
    or device raises NotRegularError instead of being followed or waited on."""
    fd = open_regular(Path(path))
    try:
        return sha256_fd(fd)[0]
    finally:
        os.close(fd)


def entry_kind(mode: int) -> str:
    """What an lstat mode is, in the words orch's messages use."""
    for test, name in ((stat.S_ISREG, "file"), (stat.S_ISDIR, "folder"), (stat.S_ISLNK, "link"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"
