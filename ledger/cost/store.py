"""The append-only, tamper-evident ledger: one Arrow IPC stream file, one record batch per record.

Appends hold an exclusive flock, fsync, and leave the file as it was on any error; verify checks every byte.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import ValidationError

import ledger.cost.merkle as merkle
from ledger.cost.hints import extend_index, read_tail_hint, write_tail_hint
from ledger.cost.layout import Columns, frame, index_valid, layout
from ledger.cost.merkle import TreeHead
from ledger.cost.orphans import orphans_of
from ledger.cost.record import (
    ASSIGNED,
    GENESIS,
    LATEST,
    VERSIONS,
    LedgerRecord,
    login_name,
    record_from_row,
    record_message,
    schema_message,
    schema_of,
    scrub_note,
    seal,
)
from ledger.cost.repair import repair_torn_tail
from ledger.cost.salt import host_hash
from ledger.cost.scan import UNPARSEABLE, decode_message, decode_or_fail, file_version, scan_messages
from ledger.cost.verify import MAX_PROBLEMS, VERIFY_CHUNK, VerifyReport, verify_fast, verify_slow
from protocol.errors import FailedError, UsageError
from protocol.fileio import fsync_dir


class Ledger:
    """The ledger file at `path` (normally Home.ledger_path); `fsync=False` only for tests that need speed.

    `verify_chunk` (records per hashing task of verify) is a parameter so tests can exercise the two-process path.
    """

    def __init__(self, path: Path, *, fsync: bool = True, verify_chunk: int = VERIFY_CHUNK) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.verify_chunk = verify_chunk
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self.tail_path = self.path.with_name(self.path.name + ".tail")
        self.index_path = self.path.with_name(self.path.name + ".idx")  # int64 message offsets: a checked cache

    # ---- locking and mapping ------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[tuple[Any, int]]:
        """The ledger bytes (read-only map) and their count, read under a shared lock.

        A ledger that does not exist reads empty and nothing is created (reading never makes a home).
        """
        if not self.path.exists():
            yield b"", 0
            return
        with self._locked(exclusive=False):
            try:
                fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                yield b"", 0
                return
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    yield b"", 0
                    return
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0), prot=mmap.PROT_READ)
                try:
                    yield mm, size
                finally:
                    with contextlib.suppress(BufferError):
                        mm.close()  # NumPy views still alive: the map closes when they are collected
            finally:
                os.close(fd)

    def host_hash(self) -> str:
        """This host's name hashed with this ledger directory's salt."""
        return host_hash(self.path.parent)

    # ---- append -------------------------------------------------------------------------------------

    def append(self, **fields: Any) -> LedgerRecord:
        """Append one record; seq, prev_hash, prev_message_sha256 and record_hash are assigned here.

        Raises UsageError for an invalid record and FailedError when the ledger cannot be written
        (the file is then exactly as it was) or has a torn tail (run `orch ledger repair`).
        """
        for name in ASSIGNED:
            if name in fields:
                raise UsageError(f"ledger field {name} is assigned by the ledger, not by the caller")
        if fields.get("host") is None:
            fields["host"] = self.host_hash()
        if fields.get("user") is None:
            fields["user"] = login_name()
        if isinstance(fields.get("note"), str):
            fields["note"] = scrub_note(fields["note"])
        with self._locked(exclusive=True):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                size = os.fstat(fd).st_size
                head = max(len(schema_message(v)) for v in VERSIONS)
                version = file_version(os.pread(fd, head, 0), size) if size else LATEST
                if version == 1:
                    fields.pop("user", None)  # a version 1 ledger keeps version 1 records: its schema has no user
                seq, prev_hash, prev_message, _ = self._tail(fd, size, version)
                self._refuse_truncated(seq)
                try:
                    record = seal({**fields, "seq": seq, "prev_hash": prev_hash, "prev_message_sha256": prev_message},
                                  version)
                except ValidationError as err:
                    first = err.errors()[0]
                    where = ".".join(str(x) for x in first["loc"])
                    raise UsageError(f"ledger record refused: {where}: {first['msg']}") from None
                message = record_message(record)
                data = (schema_message(version) if size == 0 else b"") + message
                self._write(fd, size, data)
            finally:
                os.close(fd)
            new_size = size + len(data)
            write_tail_hint(self.tail_path, new_size, new_size - len(message), seq + 1)
            extend_index(self.index_path, seq, new_size - len(message))
        return record

    def _write(self, fd: int, size: int, data: bytes) -> None:
        """Write at `size` and fsync; on any failure truncate back to `size`, so no half record remains."""
        try:
            view = memoryview(data)
            offset = size
            while view:
                written = os.pwrite(fd, view, offset)
                view = view[written:]
                offset += written
            if self.fsync:
                os.fsync(fd)
                if size == 0:
                    fsync_dir(self.path.parent)
        except BaseException as err:
            restored = True
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            except OSError:
                restored = False
            if not isinstance(err, OSError):
                raise
            state = f"left as it was ({size} bytes)" if restored else "NOT restored; run `orch ledger verify`"
            raise FailedError(f"ledger write failed ({err.strerror or err}); the ledger is {state}; "
                              "free disk space or fix permissions and retry") from err

    def _tail(self, fd: int, size: int, version: int = LATEST) -> tuple[int, str, str, int | None]:
        """(next seq, last record_hash, sha256 of the last message, its offset) of the file behind fd."""
        if size == 0:
            return 0, GENESIS, hashlib.sha256(schema_message(version)).hexdigest(), None
        hint = read_tail_hint(self.tail_path)
        if hint is not None and hint.get("size") == size and isinstance(hint.get("offset"), int):
            offset = int(hint["offset"])
            raw = os.pread(fd, size - offset, offset)
            try:
                row = decode_message(raw, version)
                if int(row["seq"]) == int(hint.get("records", -1)) - 1:
                    return int(row["seq"]) + 1, str(row["record_hash"]), hashlib.sha256(raw).hexdigest(), offset
            except UNPARSEABLE:
                pass  # a stale or wrong hint: scan the file
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as mm:
            scan = scan_messages(mm, size)
            if scan.schema_problem:
                raise FailedError(f"ledger {self.path.name}: {scan.schema_problem}; nothing appended; "
                                  "run `orch ledger verify`")
            if scan.end != size:
                raise FailedError(
                    f"ledger {self.path.name} has a torn tail ({size - scan.end} bytes at offset {scan.end} "
                    "do not parse); nothing appended; run `orch ledger verify`, then `orch ledger repair`"
                )
            if not scan.spans:
                return 0, GENESIS, hashlib.sha256(bytes(mm[:size])).hexdigest(), None
            start, end = scan.spans[-1]
            raw = bytes(mm[start:end])
        row = decode_message(raw, scan.version)
        return int(row["seq"]) + 1, str(row["record_hash"]), hashlib.sha256(raw).hexdigest(), start

    def _refuse_truncated(self, records: int) -> None:
        """The hint counts every record ever appended; a file holding fewer lost records: never append (which
        would lower the count and hide the loss), so the truncation stays visible to `verify`."""
        hint = read_tail_hint(self.tail_path)
        appended = hint.get("records") if hint is not None else None
        if isinstance(appended, int) and appended > records:
            raise FailedError(
                f"ledger {self.path.name} holds {records} records but {appended} were appended "
                f"({self.tail_path.name}): it was truncated; nothing appended; restore the ledger from a copy"
            )

    # ---- reading ------------------------------------------------------------------------------------

    def _columns(self, buf: Any, size: int) -> Columns | None:
        """Fast column access when the whole file frames with this pyarrow's layout.

        Framing starts from the offset index when the index checks out against the bytes (vectorised),
        frames the rest message by message, and rewrites the index when it had to frame more than it held.
        """
        version = file_version(buf, size)
        lay = layout(version)
        schema = schema_message(version)
        if lay is None or size < len(schema) or bytes(buf[: len(schema)]) != schema:
            return None
        try:
            known = np.fromfile(self.index_path, dtype="<i8")
        except (OSError, ValueError):
            known = np.zeros(0, dtype=np.int64)
        known = known[known < size]
        if not index_valid(buf, size, known, len(schema), lay):
            known = np.zeros(0, dtype=np.int64)
        resume = len(schema) if len(known) == 0 else int(known[-1])
        rest, stop = frame(buf, resume, size, lay)
        if stop != size:
            return None
        starts = np.concatenate([known[:-1], rest]) if len(known) else rest
        if len(rest) > 1:
            tmp = self.index_path.with_name(f"{self.index_path.name}.{os.getpid()}.tmp")
            try:
                starts.astype("<i8").tofile(tmp)
                os.replace(tmp, self.index_path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        return Columns(buf, size, starts, lay)

    def table(self, columns: list[str] | None = None, *, dictionary: bool = False) -> pa.Table:
        """The complete records as an Arrow table of the named columns (all when None).

        `dictionary=True` may return string columns dictionary-encoded (same values): what accounting groups on.
        """
        with self._mapped() as (buf, size):
            schema = schema_of(file_version(buf, size))
            names = columns or schema.names
            cols = self._columns(buf, size) if size else None
            if cols is not None:
                arrays = cols.arrows(names, dictionary=dictionary)
                if dictionary:
                    return pa.table([arrays[n] for n in names], names=names)
                return pa.table([arrays[n] for n in names], schema=pa.schema([schema.field(n) for n in names]))
            scan = scan_messages(buf, size)
            if not scan.spans or scan.schema_problem:
                return schema.empty_table().select(names)
            prefix = pa.py_buffer(bytes(buf[: scan.spans[-1][1]]))
            return pa.ipc.open_stream(prefix).read_all().select(names)

    def column_names(self) -> list[str]:
        """The columns of this ledger's record version (the latest for a ledger not yet written)."""
        with self._mapped() as (buf, size):
            return list(schema_of(file_version(buf, size)).names)

    def version(self) -> int:
        """The record version of this ledger file (the latest for a ledger not yet written)."""
        with self._mapped() as (buf, size):
            return file_version(buf, size)

    def records(self, run_id: str | None = None) -> list[LedgerRecord]:
        """The complete records in ledger order (only those of `run_id` when given)."""
        with self._mapped() as (buf, size):
            version = file_version(buf, size)
            cols = self._columns(buf, size) if size else None
            if cols is not None:
                chosen = np.arange(cols.n)
                if run_id is not None:
                    ids = cols.arrow("run_id")
                    chosen = np.flatnonzero(pc.equal(ids, run_id).fill_null(False).to_numpy(zero_copy_only=False))
                ends = [*cols.starts[1:].tolist(), size]
                starts = cols.starts.tolist()
                spans = [(starts[i], ends[i]) for i in chosen.tolist()]
            else:
                spans = scan_messages(buf, size).spans
            out = []
            for i, (start, end) in enumerate(spans):
                row = decode_or_fail(buf, start, end, i, version)
                if run_id is None or row["run_id"] == run_id:
                    out.append(record_from_row(row))
            return out

    def orphans(self) -> list[tuple[str, str]]:
        """(run_id, package) of open records never closed, in ledger order (no verification: see `verify`)."""
        return orphans_of(self.table(["seq", "run_id", "package", "status"], dictionary=True))

    # ---- integrity ----------------------------------------------------------------------------------

    def verify(self, against: TreeHead | None = None) -> VerifyReport:
        """Check schema, seq, hash chain, message digests and every byte; name the first bad seq."""
        with self._mapped() as (buf, size):
            fast = self._verify_fast(buf, size) if size else None
            if fast is not None:
                n, keys = fast
                report: dict[str, Any] = {"ok": True, "size": n, "problems": []}
                # leaves only for a consistency proof: 1M digests are not free
                record_hashes = self._record_hashes_of(buf, size) if against is not None else []
            else:
                report, record_hashes, keys = verify_slow(buf, size)
        report["bytes"] = size
        hint = read_tail_hint(self.tail_path)
        if hint is not None and isinstance(hint.get("records"), int) and hint["records"] > report["size"]:
            report["problems"].append(
                f"truncated: {hint['records']} records were appended but {report['size']} complete records remain"
            )
            report["ok"] = False
            if report.get("first_bad_seq") is None:
                report["first_bad_seq"] = report["size"]
        if against is not None:
            leaves = [merkle.leaf_hash(h) for h in record_hashes]
            if not merkle.consistent(leaves, against):
                report["ok"] = False
                report["problems"].append(
                    f"not an extension of tree head {against}: the ledger has {len(leaves)} records "
                    "and no consistency proof to that head verifies"
                )
        report["orphaned"] = orphans_of(keys)
        report["problems"] = report["problems"][:MAX_PROBLEMS]
        return VerifyReport(**report)

    def _verify_fast(self, buf: Any, size: int) -> tuple[int, pa.Table] | None:
        """The vectorised verification (ledger.cost.verify.verify_fast); None unless every check passes."""
        return verify_fast(self._columns(buf, size), buf, size, self.verify_chunk)

    def record_hashes(self) -> list[bytes]:
        """The record hashes (32 bytes each) of the complete records, in ledger order: the Merkle leaves' data."""
        with self._mapped() as (buf, size):
            return self._record_hashes_of(buf, size)

    def _record_hashes_of(self, buf: Any, size: int) -> list[bytes]:
        cols = self._columns(buf, size) if size else None
        if cols is not None:
            with contextlib.suppress(ValueError):
                return _hashes(cols.hex64(cols.extract(["record_hash"])["record_hash"])[0])
        scan = scan_messages(buf, size)
        return [bytes.fromhex(str(decode_or_fail(buf, s, e, i, scan.version)["record_hash"]))
                for i, (s, e) in enumerate(scan.spans)]

    def head(self) -> TreeHead:
        """RFC 6962 tree head over the record hashes of the complete records."""
        leaves = [merkle.leaf_hash(h) for h in self.record_hashes()]
        return TreeHead(size=len(leaves), root=merkle.root(leaves).hex())

    def consistency(self, old_size: int, old_root: str) -> bool:
        """True when the head (old_size, old_root) is a prefix of this ledger, by an RFC 6962 consistency proof."""
        leaves = [merkle.leaf_hash(h) for h in self.record_hashes()]
        return merkle.consistent(leaves, TreeHead(size=old_size, root=old_root))

    # ---- repair -------------------------------------------------------------------------------------

    def repair(self) -> Path | None:
        """Move a torn tail aside into `<ledger>.torn-<time>-<offset>` and cut it off; None if there is none.

        Refuses when a complete record follows the unparseable bytes: that is damage, not a torn append.
        """
        with self._locked(exclusive=True):
            return repair_torn_tail(self.path)


def _hashes(hex_rows: np.ndarray) -> list[bytes]:
    """32-byte digests from an (n, 64) matrix of hex characters."""
    data = bytes.fromhex(hex_rows.tobytes().decode())
    return [data[i : i + 32] for i in range(0, len(data), 32)]
