"""orch's hands on what a package could write: every path below a folder orch made is opened one component at a time
from that folder's descriptor with O_NOFOLLOW, so a link a package planted is never followed, a FIFO never waited on.

This is the fallback bubblewrap's safe_openat uses where openat2(RESOLVE_IN_ROOT) is missing; Python's os module has no
openat2. Hashing, chmod and moves act on descriptors or on (folder descriptor, name) pairs, never on a path string
that a package could swap between orch's check and orch's use. docs/THREAT_MODEL.md lists every caller.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from protocol.fileio import NotRegularError, entry_kind

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20
V = TypeVar("V")
Fingerprint = dict[str, tuple[str, int, int, int, int]]  # rel -> (kind, inode, size, mtime_ns, ctime_ns)


class UnsafeEntry(Exception):
    """An entry orch will not use: a link, a special file, or a file where a folder was expected (or the reverse)."""

    def __init__(self, path: str, kind: str, expected: str = "folder") -> None:
        super().__init__(f"{path} is a {kind}, not a {expected}")
        self.path, self.kind = path, kind


@dataclass(frozen=True)
class Entry:
    """One entry of a walked tree, as lstat saw it (never followed)."""

    rel: str  # relative to the walked folder, '/'-separated
    kind: str  # file | folder | link | FIFO | socket | character device | block device | special file
    size: int
    mode: int
    ino: int
    mtime_ns: int
    ctime_ns: int


def open_dir(root: Path | str, rel: Sequence[str] | str = ()) -> int:
    """A descriptor of root/rel, every component (root's last one too) opened without following a link; the caller
    closes it. UnsafeEntry names the component that is a link or not a folder."""
    parts = [p for p in (rel.split("/") if isinstance(rel, str) else rel) if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeEntry(f"{root}/{'/'.join(parts)}", "path with '..'")
    fd = _open_component(str(root), None, str(root))
    shown = str(root)
    for part in parts:
        shown = f"{shown}/{part}"
        try:
            nfd = _open_component(part, fd, shown)
        finally:
            os.close(fd)
        fd = nfd
    return fd


def open_dir_at(dir_fd: int, name: str) -> int:
    """A descriptor of the folder `name` in an open folder, never through a link (UnsafeEntry otherwise)."""
    return _open_component(name, dir_fd, name)


def _open_component(name: str, dir_fd: int | None, shown: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            raise UnsafeEntry(shown, entry_kind(st.st_mode)) from None
        raise


@contextmanager
def opened_dir(root: Path | str, rel: Sequence[str] | str = ()) -> Iterator[int]:
    fd = open_dir(root, rel)
    try:
        yield fd
    finally:
        os.close(fd)


def open_regular(dir_fd: int, name: str, shown: str) -> int:
    """A regular file's descriptor (non-blocking open, no link followed); NotRegularError otherwise."""
    try:
        fd = os.open(name, _FILE, dir_fd=dir_fd)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise NotRegularError(errno.ELOOP, "a link, not a regular file", shown) from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularError(errno.EINVAL, f"a {entry_kind(mode)}, not a regular file", shown)
    return fd


def read_at(root: Path | str, rel: str, limit: int | None = None) -> bytes:
    """The bytes of the regular file root/rel, no component followed; `limit`: at most that many."""
    folder, _, name = rel.rpartition("/")
    with opened_dir(root, folder) as dfd:
        fd = open_regular(dfd, name, f"{root}/{rel}")
        try:
            out = bytearray()
            while limit is None or len(out) < limit:
                chunk = os.read(fd, _CHUNK if limit is None else min(_CHUNK, limit - len(out)))
                if not chunk:
                    break
                out += chunk
            return bytes(out)
        finally:
            os.close(fd)


def walk(dir_fd: int, prefix: str = "") -> Iterator[Entry]:
    """Every entry below an open folder, depth first, folders before what they hold; nothing followed. An entry
    that becomes a link between its lstat and its open is reported as what the open found, never entered."""
    for name in sorted(os.listdir(dir_fd)):
        rel = f"{prefix}{name}"
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        kind = entry_kind(st.st_mode)
        if kind != "folder":
            yield Entry(rel, kind, st.st_size, stat.S_IMODE(st.st_mode), st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            continue
        try:
            sub = _open_component(name, dir_fd, rel)
        except UnsafeEntry as err:
            yield Entry(rel, err.kind, st.st_size, stat.S_IMODE(st.st_mode), st.st_ino, st.st_mtime_ns,
                        st.st_ctime_ns)
            continue
        except FileNotFoundError:
            continue
        try:
            yield Entry(rel, "folder", 0, stat.S_IMODE(st.st_mode), st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            yield from walk(sub, f"{rel}/")
        finally:
            os.close(sub)


def tree_entries(root: Path | str) -> list[Entry]:
    """walk() of a folder by path (the folder itself opened without following a link); [] if it does not exist."""
    try:
        fd = open_dir(root)
    except FileNotFoundError:
        return []
    try:
        return list(walk(fd))
    finally:
        os.close(fd)


def stat_fingerprint(root: Path | str) -> Fingerprint:
    """rel -> (kind, inode, size, mtime, ctime) of every entry: any write, chmod, rename or replacement changes the
    ctime, which no process can set back, so two equal fingerprints mean an untouched tree (checkpoints: cheaper than
    hashing tens of gigabytes before every package)."""
    return {e.rel: (e.kind, e.ino, e.size, e.mtime_ns, e.ctime_ns) for e in tree_entries(root)}


def file_fingerprint(path: Path | str) -> tuple[int, int, int, int, int] | None:
    """(mode, inode, size, mtime, ctime) of one entry itself (a link is not followed), as stat_fingerprint for a
    tree, with the mode in full so that a chmod shows even within one clock tick; None when there is none."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def make_dirs(dir_fd: int, rel: str, fresh_last: bool = False) -> int:
    """mkdir -p of rel below an open folder, never through a link; returns the last folder's descriptor. With
    `fresh_last`, the last folder must not exist yet (UnsafeEntry names it otherwise)."""
    parts = [p for p in rel.split("/") if p]
    fd = os.dup(dir_fd)
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        try:
            os.mkdir(part, 0o700, dir_fd=fd)
        except FileExistsError:
            if last and fresh_last:
                os.close(fd)
                raise UnsafeEntry(rel, "folder that already existed", "new folder") from None
        try:
            nfd = _open_component(part, fd, "/".join(parts[: i + 1]))
        finally:
            os.close(fd)
        fd = nfd
    return fd


def move_file(src_dir: int, name: str, dst_dir: int, dst_name: str) -> None:
    """Move one entry between open folders: rename(2) moves the entry itself, never what a link points to; across
    file systems, a regular file is copied through descriptors into a new file (O_EXCL) and then unlinked."""
    try:
        os.rename(name, dst_name, src_dir_fd=src_dir, dst_dir_fd=dst_dir)
        return
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
    src = open_regular(src_dir, name, name)
    try:
        dst = os.open(dst_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                      dir_fd=dst_dir)
        try:
            while chunk := os.read(src, _CHUNK):
                os.write(dst, chunk)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.unlink(name, dir_fd=src_dir)


def chmod_tree_read_only(dir_fd: int) -> None:
    """Clear every write bit below an open folder and on it, through descriptors (links and special files are left
    as they are: chmod on a link's name would change its target)."""
    for name in os.listdir(dir_fd):
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = _open_component(name, dir_fd, name)
            except (UnsafeEntry, FileNotFoundError):
                continue
            try:
                chmod_tree_read_only(sub)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = open_regular(dir_fd, name, name)
            except (NotRegularError, FileNotFoundError):
                continue
            try:
                os.fchmod(fd, stat.S_IMODE(os.fstat(fd).st_mode) & ~0o222)
            finally:
                os.close(fd)
    os.fchmod(dir_fd, stat.S_IMODE(os.fstat(dir_fd).st_mode) & ~0o222)



def fingerprint_changes(before: Mapping[str, V], now: Mapping[str, V],
                        kind: Callable[[V], str | None] = lambda _v: None) -> list[str]:
    """'rel (changed | added | removed)' for every entry whose fingerprint (or sealed digest) differs; `kind` names
    what an entry now is where that is worth saying ('added: a link', 'changed into a folder')."""
    out = []
    for rel in sorted(set(before) | set(now)):
        if rel not in now:
            out.append(f"{rel} (removed)")
        elif rel not in before:
            what = kind(now[rel])
            out.append(f"{rel} (added{'' if what is None else ': a ' + what})")
        elif before[rel] != now[rel]:
            what = kind(now[rel])
            out.append(f"{rel} (changed{'' if what is None else ' into a ' + what})")
    return out


def seal_checkpoint(folder: Path) -> Fingerprint:
    """A train package's checkpoint once it passed: read-only (through descriptors), then its fingerprint."""
    try:
        fd = open_dir(folder)
    except FileNotFoundError:
        return {}
    try:
        chmod_tree_read_only(fd)
    finally:
        os.close(fd)
    return stat_fingerprint(folder)
